#!/usr/bin/env bash
# `tessera data tokenize` and `tessera data info`: text files -> llm.c token shards (header and tokens read
# back with od), the EOT before each document, the val/train split and the shard names, the entropy line,
# GPT-2's BPE on the golden text (tests/golden/tok) equal to tiktoken's ids, and the errors.
set -u
TS=${1:?usage: cli_tokenize.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
test_tmpdir
G=$(cd "$(dirname "$0")" && pwd)/golden/tok

header() { od -An -t d4 -N 12 "$1" | tr -s ' ' | sed 's/^ //'; }
tokens() { od -An -t u2 -j 1024 -v "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }

# ---- bytes: two documents "ab" and "cde" -> 256 97 98 256 99 100 101 --------------------------------
printf 'ab' > "$T/one.txt"; printf 'cde' > "$T/two.txt"
expect_exit 0 "7 tokens from 2 files" "$TS" data tokenize "$T/one.txt" "$T/two.txt" --out "$T/b" --name tiny \
  --val-tokens 2 --shard-tokens 2
ls "$T/b" | tr '\n' ' ' | grep -qx "tiny_train_000001.bin tiny_train_000002.bin tiny_train_000003.bin tiny_val_000000.bin " \
  && ok "llm.c's names: val first, one index over both splits" || bad "files: $(ls "$T/b")"
[ "$(header "$T/b/tiny_val_000000.bin")" = "20240520 1 2" ] && ok "header magic, version, count" \
  || bad "header: $(header "$T/b/tiny_val_000000.bin")"
[ "$(stat -c %s "$T/b/tiny_val_000000.bin")" = 1028 ] && ok "1024 + 2 n bytes" || bad "size"
[ "$(od -An -t d4 -j 12 -N 1012 -v "$T/b/tiny_val_000000.bin" | tr -s ' \n' '\n' | grep -vc '^0*$')" = 0 ] \
  && ok "the rest of the header is zero" || bad "header not zero"
got="$(tokens "$T/b/tiny_val_000000.bin") $(tokens "$T/b/tiny_train_000001.bin") $(tokens "$T/b/tiny_train_000002.bin") $(tokens "$T/b/tiny_train_000003.bin")"
[ "$got" = "256 97 98 256 99 100 101" ] && ok "EOT before each document, in order" || bad "tokens: $got"
out=$("$TS" data tokenize "$T/one.txt" "$T/two.txt" --out "$T/b2" --val-tokens 2)
grep -qF "unigram entropy of the training tokens: 2.3219 bits/token, 1.6094 nats/token" <<<"$out" \
  && ok "entropy of 5 distinct tokens: log2 5" || bad "entropy line: $out"
grep -qF "vocabulary 257 (bytes)" <<<"$out" && ok "bytes vocabulary 257" || bad "vocab line: $out"
expect_exit 0 "tokens_train_000001.bin: 5 tokens, largest id 256" "$TS" data info "$T/b2/tokens_train_000001.bin"
expect_exit 0 "2 tokens" "$TS" data info "$T/b2/tokens_val_000000.bin" --vocab-size 257
expect_exit 2 "token 256 at position 0 is outside the vocabulary of 256" "$TS" data info "$T/b2/tokens_val_000000.bin" --vocab-size 256
out=$("$TS" data tokenize "$T/one.txt" --out "$T/b3")
grep -qF "val:   0 tokens in 0 shards" <<<"$out" && ok "10% of 3 tokens rounds down to none" || bad "$out"

# ---- gpt2 on the golden text: [EOT] + tiktoken's ids ---------------------------------------------------
expect_exit 0 "vocabulary 1280 (gpt2)" "$TS" data tokenize "$G/text.txt" --out "$T/g" --tokenizer gpt2 \
  --vocab "$G/vocab.json" --merges "$G/merges.txt" --val-fraction 0 --special
n=$(od -An -t d4 -j 8 -N 4 "$G/text.ids.bin" | tr -d ' ')
[ "$(header "$T/g/tokens_train_000000.bin")" = "20240520 1 $((n + 1))" ] && ok "gpt2: $((n + 1)) tokens" \
  || bad "gpt2 header: $(header "$T/g/tokens_train_000000.bin")"
[ "$(od -An -t u2 -j 1024 -N 2 "$T/g/tokens_train_000000.bin" | tr -d ' ')" = 1279 ] && ok "gpt2: EOT first" || bad "no EOT"
if cmp -s <(tail -c +1027 "$T/g/tokens_train_000000.bin") <(tail -c +1025 "$G/text.ids.bin"); then
  ok "gpt2: the ids equal tiktoken's"; else bad "gpt2: ids differ from the golden ids"; fi

# ---- errors ---------------------------------------------------------------------------------------------
expect_exit 2 "--tokenizer gpt2 needs --vocab" "$TS" data tokenize "$T/one.txt" --out "$T/e" --tokenizer gpt2
expect_exit 2 "--out DIR is required" "$TS" data tokenize "$T/one.txt"
expect_exit 2 "expected one or more text files" "$TS" data tokenize --out "$T/e"
expect_exit 2 "sentencepiece" "$TS" data tokenize "$T/one.txt" --out "$T/e" --tokenizer sentencepiece
expect_exit 2 "$T/missing.txt" "$TS" data tokenize "$T/missing.txt" --out "$T/e"
expect_exit 2 "$T/nope.json" "$TS" data tokenize "$T/one.txt" --out "$T/e" --tokenizer gpt2 --vocab "$T/nope.json" --merges "$G/merges.txt"
expect_exit 2 "shorter than a token shard's 1024-byte header" "$TS" data info "$T/one.txt"
head -c 2000 "$G/text.txt" > "$T/text.bin"
expect_exit 2 "bad magic" "$TS" data info "$T/text.bin"
printf 'x' > "$T/blocker"
expect_exit 2 "expected a folder for the shards" "$TS" data tokenize "$T/one.txt" --out "$T/blocker"
cli_summary
