#!/usr/bin/env bash
# Hostile inputs from the command line (issue 10): checkpoint paths that are devices, FIFOs or in
# missing folders fail at once with exit 2 (and /dev/full stays a device); FIFOs given as checkpoint or
# IDX file never hang; output files (metrics, traces, images, JSON) refuse FIFOs and devices; paths with
# terminal escapes are printed escaped; `ckpt show/diff` print names with escape sequences escaped; empty data sets and
# test labels outside the training classes are errors naming the set; `bench allreduce` explains bad
# sizes. (Run by ctest as: bash cli_hardening.sh /path/to/tessera.)
set -u
TS=${1:?usage: cli_hardening.sh path/to/tessera}
SRC=$(cd "$(dirname "$0")" && pwd)
DATA=/usr/share/datasets/fashion-mnist
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$SRC/testlib.sh"
EXPECT_TIMEOUT=60 # expect_exit: every command within 60 s

# ckpt show / diff: a name holding ESC [ 3 1 m and a tab is printed escaped, never raw
seed="$SRC/fuzz/corpus/ckpt/dtypes"
out=$("$TS" ckpt show "$seed" 2>&1); rc=$?
if [ $rc -ne 0 ]; then bad "ckpt show $seed exited $rc: $out"
elif grep -q $'\x1b' <<<"$out" || grep -q $'\t' <<<"$out"; then bad "ckpt show printed raw control bytes"
elif ! grep -qF 'name\x09with\x1b[31mescapes' <<<"$out"; then bad "ckpt show lacks the escaped name: $out"
else ok "ckpt show escapes names"; fi
out=$("$TS" ckpt diff "$seed" "$SRC/fuzz/corpus/ckpt/kinds" 2>&1)
if grep -q $'\x1b' <<<"$out" || ! grep -qF 'name\x09with\x1b[31mescapes  only in A' <<<"$out"; then
  bad "ckpt diff does not escape names: $out"
else ok "ckpt diff escapes names"; fi

# FIFOs and devices as checkpoints
mkfifo "$T/fifo.ckpt"
expect_exit 2 "is a FIFO" "$TS" ckpt show "$T/fifo.ckpt"
expect_exit 2 "is a character device" "$TS" ckpt show /dev/zero

# bench allreduce: sizes it cannot run are explained
expect_exit 2 "--max-bytes 1000000000000000: 2 ranks would allocate" "$TS" bench allreduce --max-bytes 1e15
expect_exit 2 "--max-bytes '12q' is not a byte count" "$TS" bench allreduce --max-bytes 12q
expect_exit 2 "--step 3: expected 2 or 4" "$TS" bench allreduce --step 3
expect_exit 2 "--dtype 'int8': expected float32 or bfloat16" "$TS" bench allreduce --dtype int8
# the bfloat16 all-reduce (what --ddp-comm bf16 runs) checks its sums exactly at every size, odd counts included
expect_exit 0 "all_reduce bfloat16 sum, 3 processes" "$TS" bench allreduce -n 3 --min-bytes 6 --max-bytes 2m --step 4 --time 0.01 --dtype bf16

if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  echo "skip: no $DATA (the training checks need it)"
  [ $fails -eq 0 ] || exit 1
  exit 0
fi
TRAIN=("$TS" train --model mlp --epochs 1 --max-steps 2 --quiet --threads 1)

# checkpoint paths that cannot work fail before training, with exit 2
if [ -c /dev/full ]; then
  expect_exit 2 "checkpoint: /dev/full: is a character device; refusing to replace it" "${TRAIN[@]}" --checkpoint /dev/full
  [ -c /dev/full ] && ok "/dev/full is still a character device" || bad "/dev/full was replaced"
fi
expect_exit 2 "checkpoint: $T/no/dir/x.ckpt: cannot save a checkpoint there: directory $T/no/dir: No such file" \
  "${TRAIN[@]}" --checkpoint "$T/no/dir/x.ckpt"
expect_exit 2 "is a FIFO" "${TRAIN[@]}" --checkpoint "$T/fifo.ckpt"
expect_exit 2 "resume: $T/fifo.ckpt: is a FIFO" "${TRAIN[@]}" --resume "$T/fifo.ckpt"

# a FIFO as an IDX file
mkdir "$T/fifodata"
mkfifo "$T/fifodata/train-images-idx3-ubyte"
cp "$DATA/train-labels-idx1-ubyte.gz" "$T/fifodata/"
expect_exit 2 "train-images-idx3-ubyte: is a FIFO" "${TRAIN[@]}" --data "$T/fifodata"

# an empty training set; test labels that are no training class
python3 - "$T" <<'PY' || { bad "python3 could not write the IDX files"; }
import gzip, struct, sys
t = sys.argv[1]
def idx(path, magic, dims, data):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data))
import os
for d in ("empty", "labels"):
    os.mkdir(f"{t}/{d}")
idx(f"{t}/empty/train-images-idx3-ubyte.gz", 0x803, (0, 28, 28), [])
idx(f"{t}/empty/train-labels-idx1-ubyte.gz", 0x801, (0,), [])
idx(f"{t}/empty/t10k-images-idx3-ubyte.gz", 0x803, (2, 28, 28), [7] * 1568)
idx(f"{t}/empty/t10k-labels-idx1-ubyte.gz", 0x801, (2,), [0, 1])
idx(f"{t}/labels/train-images-idx3-ubyte.gz", 0x803, (4, 28, 28), [9] * 3136)
idx(f"{t}/labels/train-labels-idx1-ubyte.gz", 0x801, (4,), [0, 1, 2, 1])
idx(f"{t}/labels/t10k-images-idx3-ubyte.gz", 0x803, (3, 28, 28), [5] * 2352)
idx(f"{t}/labels/t10k-labels-idx1-ubyte.gz", 0x801, (3,), [0, 2, 7])
os.mkdir(f"{t}/small")  # a consistent set of 10x10 images
idx(f"{t}/small/train-images-idx3-ubyte.gz", 0x803, (8, 10, 10), [i % 251 for i in range(800)])
idx(f"{t}/small/train-labels-idx1-ubyte.gz", 0x801, (8,), [i % 2 for i in range(8)])
idx(f"{t}/small/t10k-images-idx3-ubyte.gz", 0x803, (2, 10, 10), [3] * 200)
idx(f"{t}/small/t10k-labels-idx1-ubyte.gz", 0x801, (2,), [0, 1])
PY
expect_exit 2 "the training set (train-images-idx3-ubyte) is empty: 0 samples" "${TRAIN[@]}" --data "$T/empty"
expect_exit 2 "t10k-labels-idx1-ubyte: sample 2 has label 7, but the training set has 3 classes" "${TRAIN[@]}" --data "$T/labels"

# every output file refuses FIFOs and devices, at once and naming the path (never blocks, never writes a device)
mkfifo "$T/out.fifo"
expect_exit 2 "--metrics-json: $T/out.fifo: is a FIFO" "${TRAIN[@]}" --metrics-json "$T/out.fifo"
if [ -c /dev/full ]; then
  expect_exit 2 "--metrics-json: /dev/full: is a character device" "${TRAIN[@]}" --metrics-json /dev/full
fi
expect_exit 2 "metrics_csv: $T/out.fifo: is a FIFO" "${TRAIN[@]}" --metrics-csv "$T/out.fifo"
expect_exit 2 "trace: $T/out.fifo: is a FIFO" "${TRAIN[@]}" --trace "$T/out.fifo"
mkfifo "$T/tr.rank1.json"
expect_exit 2 "trace: $T/tr.rank1.json: is a FIFO" env WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=1 "${TRAIN[@]}" --trace "$T/tr.json"
# names that JSON must escape (a quote, a backslash, a newline, a byte that is not UTF-8) make valid JSON
if [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
  odd="$T/fa\"sh"$'\\\n\xff'"ion"
  ln -s "$DATA" "$odd"
  expect_exit 0 "" "${TRAIN[@]}" --data "$odd" --metrics-json "$T/odd.json"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["data"] == "fa\"sh\\\n\ufffdion", d["data"]' \
    "$T/odd.json" && ok "metrics JSON escapes the data set's name" || bad "metrics JSON: $(cat -v "$T/odd.json")"
fi
"$TS" data export fashion-mnist --limit 4 --split train --out "$T/img" > /dev/null 2>&1 || bad "data export"
expect_exit 1 "--out: $T/out.fifo: is a FIFO" "$TS" data show "$T/img" --batch-size 4 --out "$T/out.fifo"
[ -p "$T/out.fifo" ] && ok "the FIFO is still a FIFO" || bad "the FIFO was replaced"
# bench loader: a list naming a directory or a FIFO is refused by name (no 2^63-byte allocation, no hang)
img=$(find "$T/img" -name '*.png' | head -1)
mkdir "$T/adir"
printf '%s 0\n%s 1\n' "$img" "$T/adir" > "$T/dirlist.txt"
printf '%s 0\n%s 1\n' "$img" "$T/out.fifo" > "$T/fifolist.txt"
expect_exit 1 "$T/adir: is a directory, expected an image file" "$TS" bench loader "$T/dirlist.txt" --seconds 0.1
expect_exit 1 "$T/out.fifo: is a FIFO (named pipe), expected an image file" "$TS" bench loader "$T/fifolist.txt" --seconds 0.1
# a list's labels are bounded as --num-classes is (label 2^31 - 1 would build a 2 TiB classifier)
printf '%s 0\n%s 2147483647\n' "$img" "$img" > "$T/biglabel.txt"
expect_exit 2 "biglabel.txt:2: label 2147483647 is too large: labels are below 1048576" "$TS" train --data "$T/biglabel.txt" \
  --model cnn --max-steps 1 --batch-size 2 --quiet
expect_exit 2 "biglabel.txt:2: label 2147483647 is too large" "$TS" data show "$T/biglabel.txt" --batch-size 2 --out "$T/g.png"
"${TRAIN[@]}" --trace "$T/t.json" --checkpoint "$T/ev.ckpt" > /dev/null 2>&1 || bad "train --trace"
expect_exit 1 "$T/out.fifo: is a FIFO" "$TS" trace merge "$T/out.fifo" "$T/t.json"
expect_exit 2 "--json: $T/out.fifo: is a FIFO" "$TS" eval --checkpoint "$T/ev.ckpt" --json "$T/out.fifo"

# a fixed-size model on data of another shape is refused up front, naming both shapes
expect_exit 2 "its samples are 1x10x10 (channels x height x width), but model mlp takes 1x28x28 only" \
  "${TRAIN[@]}" --data "$T/small" --batch-size 4
expect_exit 2 "but model cnn takes 1x28x28 only" "${TRAIN[@]}" --data "$T/small" --batch-size 4 --model cnn

# paths holding terminal escapes are printed escaped (\x1b), never raw: the "saved"/"wrote" lines and errors
E=$'\e[31m'
expect_escaped() { # expect_escaped NEEDLE CMD...: the output has NEEDLE and no raw ESC byte
  local needle=$1; shift
  local out
  out=$(timeout 60 "$@" 2>&1)
  if grep -q $'\x1b' <<<"$out"; then bad "'$*' printed a raw ESC: $(cat -v <<<"$out")"
  elif ! grep -qF -- "$needle" <<<"$out"; then bad "'$*' output lacks '$needle': $(cat -v <<<"$out")"
  else ok "escaped: $needle"; fi
}
expect_escaped 'saved checkpoint to '"$T"'/e\x1b[31m.ckpt' "${TRAIN[@]}" --checkpoint "$T/e$E.ckpt"
expect_escaped 'resumed from '"$T"'/e\x1b[31m.ckpt' "${TRAIN[@]}" --max-steps 3 --resume "$T/e$E.ckpt"
expect_escaped "$T"'/none\x1b[31m.ckpt: cannot open' "$TS" ckpt show "$T/none$E.ckpt"
expect_escaped "$T"'/none\x1b[31m.ckpt: cannot open' "${TRAIN[@]}" --resume "$T/none$E.ckpt"
expect_escaped 'to '"$T"'/e\x1b[31m.safetensors' "$TS" ckpt export "$T/e$E.ckpt" --out "$T/e$E.safetensors"
mkfifo "$T/f$E.json"
expect_escaped "$T"'/f\x1b[31m.json: is a FIFO' "${TRAIN[@]}" --metrics-json "$T/f$E.json"
expect_escaped 'wrote '"$T"'/g\x1b[31m.png' "$TS" data show "$T/img" --batch-size 4 --out "$T/g$E.png"

# a training run that works still works, and its checkpoint shows
expect_exit 0 "done: 2 steps" "${TRAIN[@]}" --checkpoint "$T/ok.ckpt"
expect_exit 0 "train.step" "$TS" ckpt show "$T/ok.ckpt"

cli_summary
