#!/usr/bin/env bash
# scripts/llmc_checkpoint.py on a GPT Tessera trained and exported (`tessera train --model gpt2-tiny`, `tessera ckpt
# export`): llm.c's header (magic 20240326, version 3, maxT, V, L, NH, C, Vp = V rounded up to 128), the file's size
# (1024 bytes + 4 per parameter with the padded vocabulary), and every tensor where llm.c's gpt2_build_from_checkpoint
# reads it: wte padded with zero rows, the Conv1D weights transposed to llm.c's (out, in), the layers of a kind one
# after another. Skips (77) without a Python with numpy and safetensors.
set -u
TS=${1:?usage: cli_llmc_checkpoint.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$("$ROOT/tests/find_python.sh" numpy safetensors) || { echo "skip: no Python with numpy and safetensors"; exit 77; }
test_tmpdir

"$TS" data tokenize "$ROOT/tests/golden/tok/text.txt" --out "$T/tok" > /dev/null 2>&1 || bad "tokenize"
out=$("$TS" train --model gpt2-tiny --seq-len 32 --data "$T/tok" --batch-size 4 --max-steps 1 --seed 5 --quiet \
  --checkpoint "$T/a.ckpt" 2>&1) && ok "train gpt2-tiny one step" || bad "train: $out"
out=$("$TS" ckpt export "$T/a.ckpt" --out "$T/a.safetensors" 2>&1) && ok "export safetensors" || bad "export: $out"
out=$("$PY" "$ROOT/scripts/llmc_checkpoint.py" "$T/a.safetensors" "$T/a.bin" --heads 2 2>&1) \
  && ok "convert: $out" || bad "convert: $out"
out=$("$PY" - "$T/a.safetensors" "$T/a.bin" <<'EOF' 2>&1
import sys, numpy as np
from safetensors.numpy import load_file
sd, raw = load_file(sys.argv[1]), open(sys.argv[2], "rb").read()
h = np.frombuffer(raw[:1024], "<i4")
L, C, V, Vp, maxT = 2, 64, 257, 384, 32
assert list(h[:8]) == [20240326, 3, maxT, V, L, 2, C, Vp] and not h[8:].any(), f"header {list(h[:8])}"
sizes = [Vp * C, maxT * C] + [n * L for n in (C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C)] + [C, C]
assert len(raw) == 1024 + 4 * sum(sizes), f"size {len(raw)}, want {1024 + 4 * sum(sizes)}"
p = np.frombuffer(raw[1024:], "<f4")
offs = np.cumsum([0] + sizes)
part = lambda i: p[offs[i]:offs[i + 1]]
g = lambda k: sd["transformer." + k]
wte = part(0).reshape(Vp, C)
assert np.array_equal(wte[:V], g("wte.weight")) and not wte[V:].any(), "wte"
assert np.array_equal(part(1).reshape(maxT, C), g("wpe.weight")), "wpe"
names = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
         "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
for j, n in enumerate(names):
    per = part(2 + j).reshape(L, -1)
    for l in range(L):
        want = g(f"h.{l}.{n}")
        want = want.T if want.ndim == 2 else want  # Conv1D (in, out) -> llm.c's (out, in)
        assert np.array_equal(per[l], want.ravel()), f"layer {l} {n}"
assert np.array_equal(part(14), g("ln_f.weight")) and np.array_equal(part(15), g("ln_f.bias")), "ln_f"
print("every tensor in place")
EOF
) && ok "llm.c layout: $out" || bad "llm.c layout: $out"
out=$("$PY" "$ROOT/scripts/llmc_checkpoint.py" "$T/a.safetensors" "$T/b.bin" --heads 3 2>&1) \
  && bad "3 heads of a 64-wide model accepted" || { grep -q "3 heads do not divide the width 64" <<<"$out" \
  && ok "heads that do not divide the width refused" || bad "heads: $out"; }
cli_summary
