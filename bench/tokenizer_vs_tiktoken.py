#!/usr/bin/env python3
"""
bench/tokenizer_vs_tiktoken.py — Tessera's GPT-2 BPE against tiktoken and transformers on a few MB of text,
and the encoders' speed. Run by bench/tokenizer_vs_tiktoken.sh (which builds the inputs and runs tessera).

    python bench/tokenizer_vs_tiktoken.py TESSERA WORKDIR

Needs tiktoken, transformers, tokenizers, numpy (.pyvenv-torch has them); exits 77 without them.
1. Trains an 8192-token byte-level BPE (tokenizers) on the King James Bible and writes it in GPT-2's files
   (scripts/gen_tok_golden.py's train()), and also checks the 1280-token golden vocabulary.
2. Documents: the KJV (`bible -f gen1:1-rev22:21`), every /usr/share/common-licenses file, 60 man pages, and
   a generated document of random assigned code points of every script (letters, digits, marks, symbols,
   spaces, emoji) -- every file one document.
3. `tessera data tokenize DOCS --tokenizer gpt2` writes shards; they must equal [EOT] + encode_ordinary(doc)
   per document from tiktoken, and from transformers.GPT2Tokenizer(vocab, merges) (split_special_tokens).
4. Speed: tiktoken's encode_ordinary on the KJV (one thread) vs tessera's encoder (as the command reports).
"""
import glob
import gzip
import os
import random
import subprocess
import sys
import time
import unicodedata

try:
    import numpy as np
    import tiktoken  # noqa: F401
    import transformers
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import gen_tok_golden as g  # noqa: E402


def random_unicode(n, seed=1):
    rnd = random.Random(seed)
    pool = [chr(c) for c in range(0x20, 0x30000)
            if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    spaces = [" ", " ", " ", "\n", "\t", "\u00a0", "\u3000", "  ", "\r\n"]
    out = []
    while sum(map(len, out)) < n:
        out.append("".join(rnd.choice(pool) for _ in range(rnd.randint(1, 12))))
        out.append(rnd.choice(spaces))
    return "".join(out)


def documents(work):
    docs = []
    kjv = g.kjv()
    docs.append(("kjv.txt", kjv))
    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p) and not os.path.islink(p):
            docs.append((os.path.basename(p) + ".txt", open(p, encoding="utf-8", errors="replace").read()))
    for p in sorted(glob.glob("/usr/share/man/man1/*.1.gz"))[:60]:
        docs.append((os.path.basename(p) + ".txt", gzip.open(p, "rt", errors="replace").read()))
    docs.append(("unicode.txt", random_unicode(300000)))
    docs.append(("edge.txt", g.EDGE * 50))
    paths = []
    for name, text in docs:
        path = os.path.join(work, "docs", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        paths.append(path)
    return docs, paths


def read_shards(pattern):
    ids = []
    for p in sorted(glob.glob(pattern)):
        raw = open(p, "rb").read()
        h = np.frombuffer(raw[:1024], dtype=np.int32)
        assert h[0] == 20240520 and h[1] == 1 and len(raw) == 1024 + 2 * h[2], p
        ids.extend(np.frombuffer(raw[1024:], dtype=np.uint16).tolist())
    return ids


def check(tessera, work, vocab_path, merges_path, vocab, docs, paths, label):
    out = os.path.join(work, "shards_" + label)
    r = subprocess.run([tessera, "data", "tokenize", *paths, "--out", out, "--tokenizer", "gpt2", "--vocab",
                        vocab_path, "--merges", merges_path, "--val-tokens", "0", "--val-fraction", "0"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"tessera data tokenize failed: {r.stderr}")
    print(r.stdout.strip().splitlines()[0])
    ours = read_shards(os.path.join(out, "tokens_*.bin"))
    enc = g.tiktoken_encoding(vocab)
    hf = transformers.GPT2Tokenizer(vocab_path, merges_path)
    eot = vocab[g.EOT]
    want_tt, want_hf = [], []
    for _, text in docs:
        want_tt += [eot] + enc.encode_ordinary(text)
        want_hf += [eot] + hf.encode(text, split_special_tokens=True)
    nbytes = sum(len(t.encode()) for _, t in docs)
    for name, want in (("tiktoken", want_tt), ("transformers", want_hf)):
        if ours != want:
            i = next((k for k in range(min(len(ours), len(want))) if ours[k] != want[k]), min(len(ours), len(want)))
            print(f"{label}: DIFFERENT from {name} at id {i} of {len(want)}: ours {ours[i:i+5]} vs {want[i:i+5]}: "
                  f"{enc.decode(want[max(0, i-5):i+5])!r}")
            return False
        print(f"{label}: equal to {name}: {len(want)} ids, {nbytes / 1e6:.2f} MB of text in {len(docs)} documents")
    return True


def main():
    tessera, work = sys.argv[1], sys.argv[2]
    docs, paths = documents(work)
    ok = True
    golden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden", "tok")
    import json
    vg = json.load(open(os.path.join(golden, "vocab.json"), encoding="utf-8"))
    ok &= check(tessera, work, os.path.join(golden, "vocab.json"), os.path.join(golden, "merges.txt"), vg, docs,
                paths, "vocab-1280")
    g.VOCAB = 8192
    vocab, merges = g.train([docs[0][1]] + [t for _, t in docs[1:-2]])
    vp, mp = os.path.join(work, "vocab.json"), os.path.join(work, "merges.txt")
    json.dump(vocab, open(vp, "w", encoding="utf-8"), ensure_ascii=False)
    open(mp, "w", encoding="utf-8").write("#version: 0.2\n" + "\n".join(merges) + "\n")
    ok &= check(tessera, work, vp, mp, vocab, docs, paths, "vocab-8192")
    enc = g.tiktoken_encoding(vocab)
    kjv = docs[0][1]
    t0 = time.perf_counter()
    enc.encode_ordinary(kjv)
    dt = time.perf_counter() - t0
    print(f"tiktoken {tiktoken.__version__} encode_ordinary, KJV {len(kjv.encode()) / 1e6:.2f} MB, one thread: "
          f"{len(kjv.encode()) / 1e6 / dt:.2f} MB/s")
    r = subprocess.run([tessera, "data", "tokenize", paths[0], "--out", os.path.join(work, "kjv"), "--tokenizer", "gpt2",
                        "--vocab", vp, "--merges", mp], capture_output=True, text=True, check=True)
    print("tessera: " + r.stdout.splitlines()[0])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    import tiktoken
    main()
