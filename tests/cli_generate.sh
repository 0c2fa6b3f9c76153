#!/usr/bin/env bash
# CLI test for `tessera generate` (run by ctest as: bash cli_generate.sh /path/to/tessera): the tiny GPT-2 of
# tests/golden (scripts/gen_gpt_golden.py: transformers' GPT2LMHeadModel after 20 AdamW steps, saved by
# save_pretrained) continues its prompt greedily with the tokens transformers' generate(do_sample=False)
# gave (tests/golden/gpt_greedy.txt); sampling is the same for a seed; --top-k 1 is greedy; the flags'
# errors and a weights file that does not fit the model's sizes.
set -u
BIN=${1:?usage: cli_generate.sh /path/to/tessera}
HERE=$(cd "$(dirname "$0")" && pwd)
W="$HERE/golden/gpt_tiny_trained.safetensors"
SIZES=(--model gpt2-tiny --n-layer 2 --n-head 4 --n-embd 48 --seq-len 80 --vocab-size 320)
fail=0
expect_rc() { # expect_rc WANT GOT DESCRIPTION
    if [ "$2" -ne "$1" ]; then
        echo "FAIL: $3: exit status $2, expected $1" >&2
        fail=1
    fi
}
expect_eq() { # expect_eq GOT WANT DESCRIPTION
    if [ "$1" != "$2" ]; then
        echo "FAIL: $3: got '$1', expected '$2'" >&2
        fail=1
    fi
}

prompt=$(sed -n 's/^prompt //p' "$HERE/golden/gpt_greedy.txt")
want=$(sed -n 's/^greedy //p' "$HERE/golden/gpt_greedy.txt")
got=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids "$prompt" --max-new-tokens 24 --temperature 0)
expect_rc 0 $? "greedy generation"
expect_eq "$got" "$want" "greedy tokens vs transformers' generate(do_sample=False)"
got=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids "$prompt" --max-new-tokens 24 --top-k 1 --seed 3)
expect_eq "$got" "$want" "--top-k 1 is greedy"

a=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids 1,2,3 --max-new-tokens 30 --seed 7 --top-k 40)
b=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids 1,2,3 --max-new-tokens 30 --seed 7 --top-k 40)
c=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids 1,2,3 --max-new-tokens 30 --seed 8 --top-k 40)
expect_eq "$a" "$b" "the same seed, the same tokens"
[ "$a" != "$c" ] || { echo "FAIL: seeds 7 and 8 gave the same 30 tokens" >&2; fail=1; }
n=$(echo "$a" | tr ',' '\n' | grep -c .)
expect_eq "$n" 30 "--max-new-tokens 30"
# past the context (seq-len 80): 100 new tokens after a 10-token prompt
n=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids 1,2,3,4,5,6,7,8,9,10 --max-new-tokens 100 --temperature 0 |
    tr ',' '\n' | grep -c .)
expect_eq "$n" 100 "generation past seq-len"

err=$("$BIN" generate "${SIZES[@]}" --prompt-ids 1 2>&1)
expect_rc 2 $? "no --safetensors"
case $err in *--safetensors*) ;; *) echo "FAIL: missing --safetensors: '$err'" >&2; fail=1 ;; esac
err=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids 1,x 2>&1)
expect_rc 2 $? "bad --prompt-ids"
case $err in *"1,x"*) ;; *) echo "FAIL: bad --prompt-ids: '$err'" >&2; fail=1 ;; esac
err=$("$BIN" generate --safetensors "$W" "${SIZES[@]}" --prompt-ids 1,320 2>&1)
expect_rc 2 $? "a token outside the vocabulary"
case $err in *"token 320"*) ;; *) echo "FAIL: token outside the vocabulary: '$err'" >&2; fail=1 ;; esac
err=$("$BIN" generate --safetensors "$W" --model gpt2-tiny --prompt-ids 1 2>&1)
expect_rc 2 $? "weights of other sizes"
case $err in *transformer.*) ;; *) echo "FAIL: weights of other sizes: '$err'" >&2; fail=1 ;; esac
err=$("$BIN" generate --safetensors "$W" --model gpt3 --prompt-ids 1 2>&1)
expect_rc 2 $? "an unknown preset"
case $err in *gpt2-medium*) ;; *) echo "FAIL: unknown preset: '$err'" >&2; fail=1 ;; esac
exit $fail
