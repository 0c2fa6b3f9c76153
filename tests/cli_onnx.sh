#!/usr/bin/env bash
# CLI test for `tessera export --format onnx` (run by ctest as: bash cli_onnx.sh /path/to/tessera).
# Trains the cnn and the mlp for a few steps, exports their checkpoints and checks each file with
# tests/onnx_check.py: onnx.checker, then onnxruntime on the exported reference batch against
# Tessera's logits (1e-4), again on a smaller batch (the batch dimension is symbolic). Also the
# flags' errors. Also torchvision's resnet18 from the zoo, trained on 10 class folders (its input
# shape and class count come from the checkpoint). Skips (77) when no Python has numpy, onnx and
# onnxruntime (tests/find_python.sh).
set -u
BIN=${1:?usage: cli_onnx.sh /path/to/tessera}
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
CHECK="$HERE/onnx_check.py"
fail=0
check() { # check DESCRIPTION COMMAND...: the command must succeed
    local what=$1
    shift
    if ! "$@"; then
        echo "FAIL: $what" >&2
        fail=1
    fi
}
expect_rc() { # expect_rc WANT GOT DESCRIPTION
    if [ "$2" -ne "$1" ]; then
        echo "FAIL: $3: exit status $2, expected $1" >&2
        fail=1
    fi
}

PY=$(bash "$HERE/find_python.sh" numpy onnx onnxruntime) || {
    echo "skip: no Python with numpy, onnx and onnxruntime (scripts/install-deps makes .pyvenv/)"
    exit 77
}
if ! "$BIN" export --help 2>/dev/null | grep -q "onnx"; then
    echo "FAIL: '$BIN export --help' does not describe the onnx format" >&2
    exit 1
fi

tmp=$(mktemp -d /tmp/ts_cli_onnx.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

for model in cnn mlp; do
    ckpt_flag=()
    if "$BIN" train --model $model --max-steps 3 --epochs 1 --batch-size 32 --seed 4 --checkpoint $model.ckpt \
        >train_$model.log 2>&1 && [ -s $model.ckpt ]; then
        ckpt_flag=(--checkpoint $model.ckpt) # --model comes from the checkpoint
    else
        echo "note: 'tessera train' wrote no checkpoint (no data set?); exporting fresh $model weights:"
        tail -n 3 train_$model.log
        ckpt_flag=(--model $model)
    fi
    "$BIN" export --format onnx "${ckpt_flag[@]}" --out $model.onnx --input-shape 8,1,28,28 --seed 1 \
        --reference ref_$model >out 2>err
    expect_rc 0 $? "export $model"
    check "export $model says what it wrote" grep -q "wrote $model.onnx" out
    check "$model: onnxruntime matches Tessera" "$PY" "$CHECK" $model.onnx ref_$model.input.npy \
        ref_$model.output.npy --tol 1e-4 --rerun-batch 3 --expect-initializer 1.weight
    if [ ${#ckpt_flag[@]} -eq 2 ] && [ "${ckpt_flag[0]}" = --checkpoint ]; then
        # the checkpoint's weights, not fresh ones: the same example gives other logits
        "$BIN" export --model $model --out fresh.onnx --input-shape 8,1,28,28 --seed 1 --reference fresh >/dev/null 2>&1
        check "$model: checkpoint weights were loaded" "$PY" -c "
import numpy as np, sys
sys.exit(0 if np.max(np.abs(np.load('fresh.output.npy') - np.load('ref_$model.output.npy'))) > 1e-3 else 1)"
    fi
done

# the zoo's resnet18 on 10 class folders: classes and input (3x32x32) from the checkpoint
if "$BIN" data export fashion-mnist --format png --limit 40 --split train --out fm >/dev/null 2>&1 &&
    "$BIN" train --model resnet18 --data fm --image-size 32 --max-steps 2 --batch-size 8 --lr 0.001 --quiet \
        --checkpoint r18.ckpt >train_r18.log 2>&1; then
    "$BIN" export --checkpoint r18.ckpt --out r18.onnx --reference ref_r18 >out 2>err
    expect_rc 0 $? "export resnet18"
    check "resnet18: input 1,3,32,32 from the checkpoint" grep -q "input 1,3,32,32" out
    check "resnet18: onnxruntime matches Tessera" "$PY" "$CHECK" r18.onnx ref_r18.input.npy ref_r18.output.npy \
        --tol 1e-4 --expect-initializer layer4.1.bn2.running_var
    check "resnet18: 10 outputs" "$PY" -c "
import numpy as np, sys
sys.exit(0 if np.load('ref_r18.output.npy').shape == (1, 10) else 1)"
else
    echo "FAIL: resnet18 training for the export: $(tail -3 train_r18.log)" >&2
    fail=1
fi

# a fixed batch size
"$BIN" export --model mlp --out static.onnx --input-shape 2,1,28,28 --static-batch --reference st >out 2>err
expect_rc 0 $? "export --static-batch"
check "static batch: onnxruntime matches" "$PY" "$CHECK" static.onnx st.input.npy st.output.npy
check "static batch: input dim 0 is 2" "$PY" -c "
import onnx, sys
sys.exit(0 if onnx.load('static.onnx').graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2 else 1)"

# ---- usage and errors ----------------------------------------------------------------------------
"$BIN" export --format tflite --model cnn --out x.onnx >out 2>err; expect_rc 2 $? "--format tflite"
check "unknown format named" grep -q "tflite" err
"$BIN" export --model cnn >out 2>err; expect_rc 2 $? "export without --out"
check "--out required" grep -q -- "--out" err
"$BIN" export --out x.onnx >out 2>err; expect_rc 2 $? "export without --model or --checkpoint"
"$BIN" export --model cnn --out x.onnx --input-shape 8,x,28 >out 2>err; expect_rc 2 $? "bad --input-shape"
check "bad shape named" grep -q "8,x,28" err
"$BIN" export --model resnet1000 --out x.onnx >out 2>err; expect_rc 2 $? "unknown model"
check "unknown model named" grep -q "resnet1000" err
if [ -s cnn.ckpt ]; then
    "$BIN" export --model mlp --checkpoint cnn.ckpt --out x.onnx >out 2>err; expect_rc 2 $? "mlp with a cnn checkpoint"
    check "model mismatch named" grep -q "cnn" err
fi
"$BIN" export --model cnn --out x.onnx --input-shape 8,3,28,28 >out 2>err; expect_rc 1 $? "wrong channel count"
check "conv2d shape error" grep -q "conv2d" err
mkdir adir
"$BIN" export --model cnn --out adir >out 2>err; expect_rc 1 $? "--out a directory"
check "directory refused" grep -q "directory" err
check "no temporary files left" bash -c '! ls | grep -q "\.tmp\."'
[ ! -e x.onnx ] || { echo "FAIL: a failed export left x.onnx" >&2; fail=1; }

[ $fail -eq 0 ] && echo "cli_onnx: all checks passed"
exit $fail
