#!/usr/bin/env bash
# bench/tokenizer_vs_tiktoken.sh [BUILD_DIR]: Tessera's GPT-2 BPE (tessera data tokenize) against tiktoken and
# transformers on a few MB of text (the King James Bible, licenses, man pages, random Unicode), ids compared
# exactly, and encoder speed. Needs a Python with tiktoken, transformers, tokenizers and numpy ($TS_PYTHON, or
# .pyvenv-torch/bin/python); exits 77 without one. See bench/tokenizer_vs_tiktoken.py.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
py=${TS_PYTHON:-$root/.pyvenv-torch/bin/python}
if ! "$py" -c 'import tiktoken, transformers, tokenizers, numpy' 2>/dev/null; then
  echo "skipped: no Python with tiktoken, transformers, tokenizers and numpy (set TS_PYTHON)"; exit 77
fi
command -v bible >/dev/null || { echo "skipped: no bible (Debian bible-kjv)"; exit 77; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$py" "$root/bench/tokenizer_vs_tiktoken.py" "$build/tessera" "$work"
