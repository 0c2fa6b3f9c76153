#!/usr/bin/env bash
# CLI test for weights in and out (run by ctest as: bash cli_safetensors.sh /path/to/tessera):
#   1. a trained cnn checkpoint -> `tessera ckpt export` -> safetensors.torch.load_file into the
#      equivalent torch nn.Sequential (strict) -> its logits equal Tessera's on the same input
#      (<= 1e-4; Tessera's from `test_safetensors --logits`, next to the tessera binary), and the file's
#      header and data are what the Python library writes for the same tensors;
#   2. a torch state dict saved with safetensors.torch.save_file -> `tessera ckpt import` (and export
#      again: the same header entries and data bytes) and `tessera train --init-from` (from the
#      safetensors file and from the imported checkpoint): the weights Tessera holds equal torch's
#      (--lr 0, so the steps do not move the parameters), F16 files load as float32;
#   3. files with a missing, an extra and a wrongly shaped tensor, a truncated file, bad usage: exit 2,
#      every tensor named.
# Skips (77) when no Python has torch, safetensors and numpy (tests/find_python.sh: $TS_PYTHON, the
# .pyvenv scripts/install-deps makes, python3, /usr/bin/python3), or Fashion-MNIST is not installed.
set -u
BIN=${1:?usage: cli_safetensors.sh /path/to/tessera}
HELPER=$(dirname "$BIN")/test_safetensors
DATA=/usr/share/datasets/fashion-mnist
PY=$(bash "$(dirname "$0")/find_python.sh" torch safetensors.torch numpy) || PY=""
fail=0
expect_rc() { # expect_rc WANT GOT DESCRIPTION
    if [ "$2" -ne "$1" ]; then
        echo "FAIL: $3: exit status $2, expected $1" >&2
        fail=1
    fi
}
expect_in() { # expect_in FILE TEXT DESCRIPTION
    if ! grep -qF -- "$2" "$1"; then
        echo "FAIL: $3: '$2' not in:" >&2
        cat "$1" >&2
        fail=1
    fi
}

if [ -z "$PY" ]; then
    echo "skipped: no Python with torch, safetensors and numpy (scripts/install-deps makes .pyvenv/)"
    exit 77
fi
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    echo "skipped: Fashion-MNIST is not installed in $DATA"
    exit 77
fi
if [ ! -x "$HELPER" ]; then
    echo "skipped: $HELPER was not built"
    exit 77
fi

tmp=$(mktemp -d /tmp/ts_cli_safetensors.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
export OMP_NUM_THREADS=2

cat >ref.py <<'EOF'
import json, struct, sys
import torch, torch.nn as nn
import safetensors.torch as st

def cnn():  # the reference CNN, with the names of Tessera's --model cnn
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))

def split(b):  # header length, header, data
    n = struct.unpack('<Q', b[:8])[0]
    return n, b[8:8 + n], b[8 + n:]
EOF

# ---- 1. Tessera -> torch --------------------------------------------------------------------------------
"$BIN" train --model cnn --epochs 1 --max-steps 4 --batch-size 32 --seed 3 --checkpoint a.ckpt --quiet >train.log 2>&1
expect_rc 0 $? "tessera train --checkpoint a.ckpt"
"$BIN" ckpt export a.ckpt --format safetensors --out a.safetensors >export.log 2>&1
expect_rc 0 $? "tessera ckpt export"
expect_in export.log "wrote 18 tensors of a.ckpt to a.safetensors" "export's report"
"$BIN" ckpt show a.safetensors >show.log 2>&1
expect_rc 0 $? "tessera ckpt show a.safetensors"
expect_in show.log "1.num_batches_tracked  int64" "show lists num_batches_tracked as int64"
expect_in show.log "format    bytes    2 bytes: pt" "show lists the metadata"

"$PY" - <<'EOF' >py1.log 2>&1
import sys; sys.path.insert(0, '.')
from ref import *
import numpy as np
sd = st.load_file('a.safetensors')
assert sd['1.num_batches_tracked'].dtype == torch.int64 and sd['1.num_batches_tracked'].item() == 4, sd['1.num_batches_tracked']
m = cnn()
m.load_state_dict(sd)  # strict
m.eval()
g = torch.Generator().manual_seed(7)
x = torch.randn(16, 1, 28, 28, generator=g)
x.numpy().astype('<f4').tofile('x.f32')
with torch.no_grad():
    m(x).numpy().astype('<f4').tofile('torch.f32')
# the layout the Python library writes for the same tensors and metadata
n, h, data = split(open('a.safetensors', 'rb').read())
meta = json.loads(h)['__metadata__']
assert meta['format'] == 'pt' and meta['model'] == 'cnn' and meta['step'] == '4', meta
pn, ph, pdata = split(st.save(sd))
ours = json.loads(h); ours.pop('__metadata__')
theirs = json.loads(ph)
assert list(ours.items()) == list(theirs.items()), (list(ours)[:5], list(theirs)[:5])
assert data == pdata, 'data sections differ'
assert n % 8 == 0 and h.rstrip(b' ').endswith(b'}')
print('layout ok')
EOF
expect_rc 0 $? "torch loads the exported file (py1.log)"
[ $fail -eq 0 ] || cat py1.log >&2
"$HELPER" --logits cnn a.safetensors x.f32 16 tessera.f32
expect_rc 0 $? "test_safetensors --logits"
"$PY" - <<'EOF' >logits.log 2>&1
import numpy as np
a, b = np.fromfile('tessera.f32', '<f4'), np.fromfile('torch.f32', '<f4')
assert a.shape == b.shape == (160,), (a.shape, b.shape)
d = float(np.abs(a - b).max())
print('max abs logit difference %.3g' % d)
assert d <= 1e-4, d
EOF
expect_rc 0 $? "Tessera's and torch's logits agree to 1e-4: $(cat logits.log)"
cat logits.log

# ---- 2. torch -> Tessera ---------------------------------------------------------------------------------
"$PY" - <<'EOF' >py2.log 2>&1
import sys; sys.path.insert(0, '.')
from ref import *
torch.manual_seed(11)
m = cnn()
with torch.no_grad():  # buffers other than their defaults too
    for bn in (m[1], m[5]):
        bn.running_mean.uniform_(-1, 1); bn.running_var.uniform_(0.5, 2); bn.num_batches_tracked.fill_(3)
st.save_file(m.state_dict(), 't.safetensors', metadata={'format': 'pt'})
sd = m.state_dict()
del sd['4.bias']
sd['extra.weight'] = torch.zeros(3)
sd['11.weight'] = torch.zeros(10, 64)
st.save_file(sd, 'bad.safetensors')
half = {k: (v.half() if v.is_floating_point() else v) for k, v in m.state_dict().items()}
st.save_file(half, 'half.safetensors')
EOF
expect_rc 0 $? "torch writes safetensors files (py2.log)"
"$BIN" ckpt import t.safetensors --model cnn --out t.ckpt >import.log 2>&1
expect_rc 0 $? "tessera ckpt import"
expect_in import.log "imported 18 tensors of t.safetensors into t.ckpt (cnn, 10 classes, from the file's output layer)" "import's report"
"$BIN" ckpt export t.ckpt --out t2.safetensors >/dev/null 2>&1
"$BIN" ckpt diff t.safetensors t2.safetensors --tol 0 >diff.log 2>&1
expect_rc 0 $? "import then export gives torch's tensors back exactly"
for src in t.safetensors t.ckpt; do
    "$BIN" train --model cnn --epochs 1 --max-steps 2 --batch-size 16 --lr 0 --init-from "$src" \
        --checkpoint "ft_${src%%.*}_${src##*.}.ckpt" --quiet >"ft_$src.log" 2>&1
    expect_rc 0 $? "tessera train --init-from $src"
done
"$BIN" ckpt diff ft_t_safetensors.ckpt ft_t_ckpt.ckpt --tol 0 >diff2.log 2>&1
expect_rc 0 $? "--init-from a safetensors file and from its imported checkpoint train alike"
"$BIN" ckpt export ft_t_safetensors.ckpt --out ft.safetensors >/dev/null 2>&1
"$PY" - <<'EOF' >py3.log 2>&1
import sys; sys.path.insert(0, '.')
from ref import *
t, f = st.load_file('t.safetensors'), st.load_file('ft.safetensors')
assert set(t) == set(f)
for k in t:
    if 'running' in k:
        continue  # training-mode forwards update the running statistics
    if k.endswith('num_batches_tracked'):
        assert f[k].item() == t[k].item() + 2, (k, f[k], t[k])  # 3 from torch, then 2 steps
    else:
        assert torch.equal(t[k], f[k]), k  # --lr 0: the parameters are torch's
# torch's file -> import -> export: the same header (but for the metadata) and the same data bytes
tn, th, td = split(open('t.safetensors', 'rb').read())
un, uh, ud = split(open('t2.safetensors', 'rb').read())
a, b = json.loads(th), json.loads(uh)
a.pop('__metadata__'); b.pop('__metadata__')
assert list(a.items()) == list(b.items()) and td == ud, 'import + export changed the file'
print('init-from ok')
EOF
expect_rc 0 $? "--init-from loads torch's weights (py3.log)"
[ $fail -eq 0 ] || cat py3.log >&2
"$BIN" ckpt import half.safetensors --model cnn --out half.ckpt >half.log 2>&1
expect_rc 0 $? "F16 weights import (read as float32)"
"$BIN" ckpt diff t.ckpt half.ckpt --tol 1e-2 >/dev/null 2>&1
expect_rc 0 $? "F16 weights are torch's to F16 precision"

# ---- 3. wrong files --------------------------------------------------------------------------------------
for cmd in "train --model cnn --max-steps 1 --init-from bad.safetensors" "ckpt import bad.safetensors --model cnn --out bad.ckpt"; do
    # shellcheck disable=SC2086
    "$BIN" $cmd >bad.log 2>&1
    expect_rc 2 $? "tessera $cmd"
    expect_in bad.log "1 missing key in the state dict: '4.bias'" "$cmd names the missing tensor"
    expect_in bad.log "1 unexpected key in the state dict: 'extra.weight'" "$cmd names the extra tensor"
    expect_in bad.log "size mismatch for '11.weight': the state dict has shape [10, 64], the model has shape [10, 128]" \
        "$cmd names the misshaped tensor"
    expect_in bad.log "bad.safetensors" "$cmd names the file"
done
[ ! -e bad.ckpt ] || { echo "FAIL: a refused import wrote bad.ckpt" >&2; fail=1; }
head -c 1000 t.safetensors >trunc.safetensors
"$BIN" train --model cnn --max-steps 1 --init-from trunc.safetensors >trunc.log 2>&1
expect_rc 2 $? "--init-from a truncated file"
expect_in trunc.log "trunc.safetensors: truncated" "a truncated file is named"
"$BIN" ckpt import t.safetensors --model mlp --out m.ckpt >mlp.log 2>&1
expect_rc 2 $? "cnn weights into --model mlp"
expect_in mlp.log "problems" "cnn weights into mlp: the problems are listed"
"$BIN" ckpt export a.ckpt --out x.safetensors --format onnx >/dev/null 2>&1
expect_rc 2 $? "export --format onnx"
"$BIN" ckpt export a.ckpt >/dev/null 2>&1
expect_rc 2 $? "export without --out"
"$BIN" ckpt import t.safetensors --model nosuch --out m.ckpt >/dev/null 2>&1
expect_rc 2 $? "import --model nosuch"
"$BIN" ckpt export t.safetensors --out x.safetensors >exp2.log 2>&1
expect_rc 2 $? "export of a safetensors file (not a checkpoint)"

if [ $fail -eq 0 ]; then echo "cli_safetensors: all checks passed"; fi
exit $fail
