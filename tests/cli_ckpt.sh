#!/usr/bin/env bash
# CLI test for `tessera ckpt show|diff` (run by ctest as: bash cli_ckpt.sh /path/to/tessera).
# Skips (77) when the binary has no `ckpt` subcommand yet or `tessera train` cannot
# write a checkpoint.
set -u
BIN=${1:?usage: cli_ckpt.sh /path/to/tessera}
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

if ! "$BIN" ckpt --help 2>/dev/null | grep -q "ckpt show"; then
    echo "skip: '$BIN ckpt --help' failed (ckpt subcommand not wired in)"
    exit 77
fi

tmp=$(mktemp -d /tmp/ts_cli_ckpt.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

for s in 1 2; do
    if ! "$BIN" train --model mlp --max-steps 1 --epochs 1 --seed "$s" --checkpoint "s$s.ckpt" >"train$s.log" 2>&1 ||
        [ ! -s "s$s.ckpt" ]; then
        echo "skip: 'tessera train ... --checkpoint' did not write a checkpoint:"
        tail -n 5 "train$s.log"
        exit 77
    fi
done
cp s1.ckpt copy.ckpt

# ---- help and usage --------------------------------------------------------------------
"$BIN" ckpt --help >out 2>err; expect_rc 0 $? "ckpt --help"
check "ckpt --help mentions show and diff" grep -q "ckpt show" out
"$BIN" ckpt show --help >out 2>err; expect_rc 0 $? "ckpt show --help"
check "show --help prints usage" grep -q "usage: tessera ckpt show" out
"$BIN" ckpt diff --help >out 2>err; expect_rc 0 $? "ckpt diff --help"
check "diff --help mentions --tol" grep -q -- "--tol" out
"$BIN" ckpt >out 2>err; expect_rc 2 $? "ckpt with no subcommand"
check "usage on stderr" grep -q "usage" err
"$BIN" ckpt bogus >out 2>err; expect_rc 2 $? "ckpt bogus"
check "unknown subcommand named" grep -q "bogus" err
"$BIN" ckpt show >out 2>err; expect_rc 2 $? "ckpt show without a file"
"$BIN" ckpt diff s1.ckpt >out 2>err; expect_rc 2 $? "ckpt diff with one file"
"$BIN" ckpt diff s1.ckpt s2.ckpt --tol abc >out 2>err; expect_rc 2 $? "ckpt diff --tol abc"
check "bad tolerance named" grep -q "abc" err

# ---- show ---------------------------------------------------------------------------------
"$BIN" ckpt show s1.ckpt >out 2>err; expect_rc 0 $? "ckpt show"
check "show: format version" grep -q "format version 1" out
check "show: table header" grep -Eq "name +dtype +shape +L2 norm" out
check "show: a float32 tensor row" grep -Eq "^  [^ ]+ +float32 +\[[0-9, ]+\] +[0-9.e+-]+$" out
check "show: metadata section" grep -q "^metadata" out

# ---- diff -------------------------------------------------------------------------------------
"$BIN" ckpt diff s1.ckpt copy.ckpt >out 2>err; expect_rc 0 $? "diff of identical files"
check "identical: overall max 0" grep -q "^max abs difference: 0 " out
"$BIN" ckpt diff s1.ckpt s2.ckpt >out 2>err; expect_rc 1 $? "diff of different seeds"
check "different: over tolerance marked" grep -q "over tolerance" out
check "different: final line" grep -q "^max abs difference: " out
"$BIN" ckpt diff s1.ckpt s2.ckpt --tol 1e30 >out 2>err; expect_rc 0 $? "diff with a huge tolerance"
"$BIN" ckpt diff --tol=1e30 s1.ckpt s2.ckpt >out 2>err; expect_rc 0 $? "diff --tol=X before the files"

# ---- a safetensors file against a checkpoint; files with no tensor name in common --------------
"$BIN" ckpt export s1.ckpt --out s1.safetensors >out 2>err; expect_rc 0 $? "ckpt export"
"$BIN" ckpt diff s1.safetensors s1.ckpt >out 2>err; expect_rc 0 $? "diff of an export with its checkpoint"
check "the model. prefix is matched as export writes it" grep -Eq "^max abs difference: 0 over [1-9][0-9]* tensors; 0 over tolerance 0; 0 only" out
python3 - <<'PY' || { echo "FAIL: python3 could not write files" >&2; fail=1; }
import gzip, json, os, struct
h = json.dumps({"other.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
h += b" " * ((8 - len(h) % 8) % 8)
open("other.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(8))
def idx(path, magic, dims, data):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data))
for d, side in (("c3", 28), ("c3s", 12)):  # three classes: 28x28 for mlp, 12x12 for resnet18
    os.mkdir(d)
    idx(f"{d}/train-images-idx3-ubyte.gz", 0x803, (6, side, side), [(i * 37) % 256 for i in range(6 * side * side)])
    idx(f"{d}/train-labels-idx1-ubyte.gz", 0x801, (6,), [i % 3 for i in range(6)])
    idx(f"{d}/t10k-images-idx3-ubyte.gz", 0x803, (3, side, side), [7] * (3 * side * side))
    idx(f"{d}/t10k-labels-idx1-ubyte.gz", 0x801, (3,), [0, 1, 2])
PY
"$BIN" ckpt diff other.safetensors s1.ckpt >out 2>err; expect_rc 1 $? "diff of files with no tensor name in common"
check "no common names reported" grep -q "share no tensor names (1 and [0-9]* tensors): nothing was compared" err

# ---- import: the class count from the file's output layer ----------------------------------------
for m in mlp:c3 resnet18:c3s; do
    model=${m%%:*} data=${m#*:}
    "$BIN" train --model "$model" --data "$data" --max-steps 1 --epochs 1 --batch-size 3 --quiet --checkpoint "$model.ckpt" >out 2>&1 ||
        { echo "FAIL: train $model: $(cat out)" >&2; fail=1; }
    "$BIN" ckpt export "$model.ckpt" --out "$model.safetensors" >out 2>err; expect_rc 0 $? "export $model"
    "$BIN" ckpt import "$model.safetensors" --model "$model" --out "$model.imported.ckpt" >out 2>err
    expect_rc 0 $? "import of a 3-class $model without --num-classes"
    check "$model: 3 classes from the output layer" grep -q "($model, 3 classes, from the file's output layer)" out
    "$BIN" ckpt diff "$model.safetensors" "$model.imported.ckpt" >out 2>err; expect_rc 0 $? "$model: import equals export"
done
"$BIN" ckpt import mlp.safetensors --model mlp --num-classes 10 --out x.ckpt >out 2>err
expect_rc 2 $? "--num-classes that disagrees with the file"
check "the misfit is named" grep -q "size mismatch" err

# ---- unreadable and corrupt files ---------------------------------------------------------------
"$BIN" ckpt show missing.ckpt >out 2>err; expect_rc 2 $? "show of a missing file"
check "missing file named" grep -q "missing.ckpt" err
"$BIN" ckpt diff s1.ckpt missing.ckpt >out 2>err; expect_rc 2 $? "diff with a missing file"
check "missing file named (diff)" grep -q "missing.ckpt" err
head -c 100 s1.ckpt >cut.ckpt
"$BIN" ckpt show cut.ckpt >out 2>err; expect_rc 2 $? "show of a truncated file"
check "truncated file reported" grep -q "cut.ckpt.*truncated" err
cp s1.ckpt flip.ckpt
size=$(stat -c %s flip.ckpt)
printf '\x5a' | dd of=flip.ckpt bs=1 seek=$((size - 9)) conv=notrunc status=none
if cmp -s s1.ckpt flip.ckpt; then # the byte was already 0x5a: use another value
    printf '\xa5' | dd of=flip.ckpt bs=1 seek=$((size - 9)) conv=notrunc status=none
fi
"$BIN" ckpt diff s1.ckpt flip.ckpt >out 2>err; expect_rc 2 $? "diff with a corrupt file"
check "checksum mismatch reported" grep -q "flip.ckpt.*checksum mismatch" err

if [ $fail -ne 0 ]; then
    echo "cli_ckpt: FAILED"
    exit 1
fi
echo "cli_ckpt: ok"
exit 0
