#!/usr/bin/env python3
"""
scripts/gen_tok_golden.py — a small GPT-2-format BPE vocabulary and reference token ids for the
tokenizer tests (tests/test_tokens.c), made on this machine without a network.

    .pyvenv-torch/bin/python scripts/gen_tok_golden.py     # needs tokenizers, tiktoken, transformers, numpy

1. Trains byte-level BPE merges with Hugging Face `tokenizers` (ByteLevelBPETokenizer) on the King James
   Bible (`bible -f gen1:1-rev22:21`, Debian's bible-kjv), /usr/share/common-licenses and a few man pages.
2. Writes them in GPT-2's files: tests/golden/tok/merges.txt ("#version: 0.2" then one merge a line) and
   vocab.json laid out as GPT-2's is: ids 0..255 the bytes in bytes_to_unicode() order, 256 + i the result
   of merge i, and <|endoftext|> last.
3. Encodes tests/golden/tok/text.txt (excerpts of those texts and hand-made edge cases, <|endoftext|>
   inside) with tiktoken (an Encoding built from the same files: ranks = vocab ids) and with
   transformers.GPT2Tokenizer(vocab.json, merges.txt); asserts they agree and writes the ids as an llm.c
   shard (data_common.write_datafile's layout: 256 int32 header [20240520, 1, n], then uint16):
   tests/golden/tok/text.ids.bin. README.md beside them names the versions.
"""
import glob
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import regex  # noqa: F401  (transformers' dependency; fails early when absent)
import tiktoken
import tokenizers
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "golden", "tok")
VOCAB = 1280  # 256 bytes + 1023 merges + <|endoftext|>
EOT = "<|endoftext|>"
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def kjv():
    return subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True, check=True, text=True).stdout


def man_pages():
    out = []
    for name in ["ls", "grep", "tar", "bash", "gzip"]:
        for p in glob.glob(f"/usr/share/man/man1/{name}.1.gz"):
            out.append(gzip.open(p, "rt", errors="replace").read())
    return out


def licenses():
    out = []
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p) and not os.path.islink(p):
            out.append(open(p, encoding="utf-8", errors="replace").read())
    return out


EDGE = (
    "Contractions: it's, don't, we're, I've, I'm, you'll, he'd; IT'S DON'T; it’s (curly); 's 't 're 'x ''\n"
    "Letters: Ελληνικά, русский язык, 中文字符, 日本語のテキスト, 한국어, العربية, עברית, हिन्दी नमस्ते, ไทย, ǅemal ʰmod\n"
    "Numbers: 0123456789 ٣٤٥ ३४५ １２３ ²³¹ ½¼ ⅫⅣ 𝟘𝟙 3.14159 1,000,000 v2.0-rc1 x86_64 1e-9\n"
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🤖🤖🤖 :-) <3 ☃\n"
    "CRLF line\r\nnext\r\n\r\n"
    "Spaces:   three   and\ttab\t\tand  \n\n\n  lines \t \n  \u00a0nbsp\u3000ideo\u2028ls\u0085nel\u200bzwsp\x1c\x1d\x1e\x1fseps\x0b\x0c\n"
    f"Special {EOT} inside{EOT}words and{EOT} {EOT}\n{EOT}{EOT} <|endoftext| <|endoftext|>x\n"
    "Punct: ... !!! ??? --- ((x)) [y] {z} \"q\" 'q' @#$%^&*_+=|\\/<>~`\n"
    "Code: def f(x):\n    return x**2  # comment\n\tif (a && b) { c->d[0] = 'e'; }\n"
    "Trailing spaces   \n   leading\n \n"
)


def train(texts):
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=VOCAB - 1, min_frequency=2, special_tokens=[], show_progress=False)
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: i for i, b in enumerate(b2u)}  # dict order = bytes_to_unicode's order, as GPT-2's file
    for m in merges:
        a, b = m.split(" ")
        vocab.setdefault(a + b, len(vocab))
    vocab[EOT] = len(vocab)
    return vocab, merges


def write_shard(path, ids):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(ids)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.array(ids, dtype=np.uint16).tobytes())


def tiktoken_encoding(vocab):
    u2b = {u: b for b, u in bytes_to_unicode().items()}
    ranks = {bytes(u2b[c] for c in tok): i for tok, i in vocab.items() if tok != EOT}
    return tiktoken.Encoding("golden", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={EOT: vocab[EOT]})


def main():
    os.makedirs(OUT, exist_ok=True)
    bible, lic, man = kjv(), licenses(), man_pages()
    vocab, merges = train([bible] + lic + man)
    with open(os.path.join(OUT, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(OUT, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    text = bible[:60000] + EOT + lic[2][:20000] + EOT + man[0][:25000] + EDGE + bible[-20000:] + EDGE
    with open(os.path.join(OUT, "text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    enc = tiktoken_encoding(vocab)
    ids = enc.encode(text, allowed_special="all")
    hf = transformers.GPT2Tokenizer(os.path.join(OUT, "vocab.json"), os.path.join(OUT, "merges.txt"))
    ids_hf = hf.encode(text)
    if ids != ids_hf:
        i = next(k for k in range(min(len(ids), len(ids_hf))) if ids[k] != ids_hf[k])
        sys.exit(f"tiktoken and transformers disagree at id {i}: {ids[i-3:i+3]} vs {ids_hf[i-3:i+3]}")
    assert enc.decode(ids) == text
    write_shard(os.path.join(OUT, "text.ids.bin"), ids)
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write(f"""# Tokenizer golden files

Made by scripts/gen_tok_golden.py (rerun it to regenerate) with Python {sys.version.split()[0]},
tokenizers {tokenizers.__version__} (training), tiktoken {tiktoken.__version__} and transformers
{transformers.__version__} (reference ids; both gave the same {len(ids)} ids), numpy {np.__version__}.

- vocab.json, merges.txt: a {len(vocab)}-token GPT-2-format byte-level BPE vocabulary trained on the King James
  Bible (Debian bible-kjv), /usr/share/common-licenses and five man pages; `<|endoftext|>` is id {vocab[EOT]}.
- text.txt: {len(text.encode())} bytes: excerpts of those texts and hand-made edge cases (scripts, digits,
  emoji, CRLF, whitespace runs, contractions, `<|endoftext|>` inside text).
- text.ids.bin: tiktoken's ids for text.txt (special tokens allowed) as an llm.c token shard.
""")
    print(f"vocab {len(vocab)}, text {len(text.encode())} bytes, {len(ids)} ids")


if __name__ == "__main__":
    main()
