#!/usr/bin/env bash
# ResNet weights both ways between Tessera and torchvision, through safetensors:
#  - a Tessera resnet18 checkpoint (trained a few steps on 10 class folders) exported with `tessera ckpt
#    export` loads into torchvision.models.resnet18(num_classes=10) with load_state_dict (strict) and
#    gives the same eval-mode logits as Tessera (within 1e-4);
#  - torchvision's resnet18 state dict saved with safetensors.torch.save_file loads into `--model
#    resnet18` (tessera train --init-from; strict: every tensor named when one is missing or misshaped),
#    and with --init-exclude fc a 1000-class file fine-tunes a 10-class model;
#  - the same for resnet50 (Bottleneck blocks) without training.
# Skips (77) when no Python has torch, torchvision, safetensors and numpy (tests/find_python.sh).
set -u
TS=${1:?usage: cli_torchvision.sh path/to/tessera}
BIN=$(dirname "$TS")
PY=$(bash "$(dirname "$0")/find_python.sh" torch torchvision safetensors.torch numpy) || {
  echo "skip: no Python with torch, torchvision, safetensors and numpy (scripts/install-deps makes .pyvenv/)"
  exit 77
}
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir
export OMP_NUM_THREADS=2

# logits MODEL WEIGHTS CLASSES OUT: Tessera's eval logits of the input $T/x.f32 (2,3,64,64)
logits() { "$BIN/test_safetensors" --logits "$1" "$2" "$T/x.f32" 2,3,64,64 "$4" "$3"; }
$PY - "$T" <<'EOF'
import sys, numpy as np
np.random.default_rng(3).standard_normal((2, 3, 64, 64)).astype(np.float32).tofile(sys.argv[1] + "/x.f32")
EOF

# ---- Tessera -> torchvision ------------------------------------------------------------------------------
"$TS" data export fashion-mnist --format png --limit 60 --split train --out "$T/fm" >/dev/null 2>&1
"$TS" train --model resnet18 --data "$T/fm" --image-size 32 --max-steps 3 --batch-size 8 --lr 0.001 --quiet \
  --checkpoint "$T/r18.ckpt" >"$T/train.log" 2>&1 || bad "train: $(cat "$T/train.log")"
"$TS" ckpt export "$T/r18.ckpt" --out "$T/r18.safetensors" >/dev/null 2>&1 && ok "exported" || bad "export"
logits resnet18 "$T/r18.safetensors" 10 "$T/ts.f32" && ok "Tessera logits" || bad "Tessera logits"
out=$($PY - "$T" <<'EOF'
import sys, numpy as np, torch, torchvision
from safetensors.torch import load_file
T = sys.argv[1]
torch.set_num_threads(2)
m = torchvision.models.resnet18(num_classes=10)
m.load_state_dict(load_file(T + "/r18.safetensors"))   # strict
m.eval()
x = torch.from_numpy(np.fromfile(T + "/x.f32", dtype=np.float32).reshape(2, 3, 64, 64))
with torch.no_grad():
    y = m(x).numpy()
t = np.fromfile(T + "/ts.f32", dtype=np.float32).reshape(y.shape)
print("maxdiff %.3g scale %.3g" % (np.abs(y - t).max(), np.abs(y).max()))
EOF
)
d=$(sed -n 's/maxdiff \([^ ]*\).*/\1/p' <<<"$out")
awk -v d="${d:-1}" 'BEGIN{exit !(d <= 1e-4)}' && ok "torchvision resnet18 loads Tessera's weights: same logits ($out)" \
  || bad "logits differ: $out"

# ---- torchvision -> Tessera ------------------------------------------------------------------------------
$PY - "$T" <<'EOF'
import sys, numpy as np, torch, torchvision
from safetensors.torch import save_file
T = sys.argv[1]
torch.set_num_threads(2)
torch.manual_seed(0)
for name, classes in (("resnet18", 1000), ("resnet50", 10)):
    m = getattr(torchvision.models, name)(num_classes=classes)
    m.train()
    with torch.no_grad():  # running statistics that are not the defaults
        m(torch.randn(4, 3, 64, 64))
    m.eval()
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, "%s/tv_%s.safetensors" % (T, name))
    x = torch.from_numpy(np.fromfile(T + "/x.f32", dtype=np.float32).reshape(2, 3, 64, 64))
    with torch.no_grad():
        m(x).numpy().tofile("%s/tv_%s.f32" % (T, name))
    sd = m.state_dict()
    bad = dict(sd)
    del bad["layer1.0.bn1.running_var"]
    bad["fc.weight"] = torch.zeros(3, 3)
    save_file({k: v.contiguous() for k, v in bad.items()}, "%s/bad_%s.safetensors" % (T, name))
EOF
for spec in resnet18:1000 resnet50:10; do
  name=${spec%:*}; classes=${spec#*:}
  if logits "$name" "$T/tv_$name.safetensors" "$classes" "$T/ts_$name.f32"; then
    out=$($PY -c "
import numpy as np
a = np.fromfile('$T/tv_$name.f32', dtype=np.float32); b = np.fromfile('$T/ts_$name.f32', dtype=np.float32)
print('maxdiff %.3g' % np.abs(a - b).max() if a.shape == b.shape else 'shape')")
    d=$(sed -n 's/maxdiff //p' <<<"$out")
    awk -v d="${d:-1}" 'BEGIN{exit !(d <= 1e-4)}' && ok "torchvision $name weights in Tessera: same logits ($out)" \
      || bad "$name logits: $out"
  else
    bad "$name: Tessera could not load torchvision's weights"
  fi
done
# fine-tuning torchvision's 1000-class resnet18 on 10 folders: a new fc
"$TS" train --model resnet18 --data "$T/fm" --image-size 32 --max-steps 2 --batch-size 8 --quiet \
  --init-from "$T/tv_resnet18.safetensors" --init-exclude fc --checkpoint "$T/ft.ckpt" >"$T/ft.log" 2>&1 \
  && grep -q "initialised resnet18 from $T/tv_resnet18.safetensors except fc" "$T/ft.log" \
  && ok "--init-from torchvision weights with a new fc" || bad "fine-tune: $(cat "$T/ft.log")"
out=$("$TS" train --model resnet18 --data "$T/fm" --image-size 32 --max-steps 1 --quiet \
  --init-from "$T/tv_resnet18.safetensors" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "size mismatch for 'fc.weight'" <<<"$out" && ok "1000-class fc refused without --init-exclude" \
  || bad "fc mismatch ($rc): $out"
out=$("$TS" train --model resnet18 --data "$T/fm" --image-size 32 --max-steps 1 --quiet \
  --init-from "$T/bad_resnet18.safetensors" --init-exclude fc 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "layer1.0.bn1.running_var" <<<"$out" && ok "a missing tensor is named" \
  || bad "missing tensor ($rc): $out"
out=$("$TS" ckpt import "$T/bad_resnet50.safetensors" --model resnet50 --out "$T/x.ckpt" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "layer1.0.bn1.running_var" <<<"$out" && grep -q "fc.weight" <<<"$out" \
  && ok "import names the missing and the misshaped tensor" || bad "import ($rc): $out"

"$TS" ckpt import "$T/tv_resnet50.safetensors" --model resnet50 --num-classes 10 --image-size 64 --out "$T/r50.ckpt" \
  >/dev/null 2>&1 && ok "import torchvision resnet50 (10 classes)" || bad "import resnet50"
img=$(find "$T/fm/train" -name '*.png' | head -1)
out=$("$TS" predict --checkpoint "$T/r50.ckpt" --top 2 "$img" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^$img: class [0-9] [0-9.]*%, class [0-9] [0-9.]*%$" <<<"$out" \
  && ok "predict with the imported checkpoint" || bad "predict ($rc): $out"

cli_summary
