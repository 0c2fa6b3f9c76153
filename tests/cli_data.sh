#!/usr/bin/env bash
# `tessera data export` -> `tessera data show` -> `tessera train --data DIR` on a tiny
# Fashion-MNIST subset written as PNG/JPEG files, a file list, two DDP ranks reading one shard
# each, resume through the pipeline, and errors (missing folder, corrupt and empty files named
# in the message). Seconds, not minutes; no timing is checked.
set -u
TS=${1:?usage: cli_data.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir

# expect_exit CODE NEEDLE CMD...: exit status CODE and stderr+stdout mentioning NEEDLE

# ---- export ----------------------------------------------------------------------------------
expect_exit 0 "exported 400 PNG images" "$TS" data export fashion-mnist --format png --limit 200 --out "$T/fm"
n=$(find "$T/fm/train" -name '*.png' | wc -l)
[ "$n" -eq 200 ] && ok "200 train PNGs" || bad "train PNGs: $n"
[ "$(ls "$T/fm/train" | wc -l)" -eq 10 ] && ok "10 class folders" || bad "class folders: $(ls "$T/fm/train")"
ls "$T/fm/train" | head -1 | grep -q "^0_tshirt_top$" && ok "class folders in label order" || bad "first class: $(ls "$T/fm/train" | head -1)"
expect_exit 0 "exported 100 JPEG images" "$TS" data export fashion-mnist --format jpeg --split train --limit 100 --out "$T/fmj"
[ "$(find "$T/fmj/train" -name '*.jpg' | wc -l)" -eq 100 ] && ok "100 JPEGs" || bad "JPEG count"
expect_exit 2 "unknown --format 'gif'" "$TS" data export fashion-mnist --format gif --out "$T/x"
expect_exit 2 "unknown data set 'cifar'" "$TS" data export cifar --out "$T/x"
expect_exit 2 "--out DIR is required" "$TS" data export fashion-mnist
expect_exit 2 "unknown command 'shw'" "$TS" data shw

# ---- show ------------------------------------------------------------------------------------
expect_exit 0 "wrote $T/grid.png: 16 images" "$TS" data show "$T/fm" --batch-size 16 --out "$T/grid.png"
head -c 8 "$T/grid.png" | od -An -c | grep -q "P   N   G" && ok "grid is a PNG" || bad "grid is not a PNG"
expect_exit 0 "wrote $T/gridj.png: 8 images" "$TS" data show "$T/fmj/train" --batch-size 8 --image-size 64 --out "$T/gridj.png"
expect_exit 2 "/no/such/dir" "$TS" data show /no/such/dir --out "$T/g.png"

# ---- train -------------------------------------------------------------------------------------
common=(--model cnn --threads 2 --batch-size 32 --seed 3 --quiet)
if "$TS" train --data "$T/fm" "${common[@]}" --epochs 1 --max-steps 5 --metrics-json "$T/m.json" > "$T/t.log" 2>&1; then
  ok "train --data image folder"
else
  bad "train --data image folder: $(cat "$T/t.log")"
fi
grep -q "training cnn on $T/fm: 200 images, 7 batches of 32" "$T/t.log" && ok "banner counts the images" || bad "banner: $(cat "$T/t.log")"
grep -q "test accuracy .* (200 images)" "$T/t.log" && ok "evaluates on test/" || bad "no test/ evaluation: $(cat "$T/t.log")"
grep -q '"steps": 5' "$T/m.json" && ok "5 steps" || bad "metrics: $(cat "$T/m.json")"

# a "path label" list, paths relative to the list's folder
(cd "$T/fm/train" && find . -name '*.png' | sort | sed 's|^\./||' | awk -F/ '{print $0, substr($1, 1, 1)}') > "$T/fm/train/list.txt"
expect_exit 0 "done: 3 steps" "$TS" train --data "$T/fm/train/list.txt" "${common[@]}" --epochs 1 --max-steps 3

# resume inside an epoch gives the same weights as a straight run (the pipeline seeks)
"$TS" train --data "$T/fmj" "${common[@]}" --epochs 2 --max-steps 6 --checkpoint "$T/a.ckpt" --checkpoint-dir "$T/adir" \
  --checkpoint-every 2 > "$T/a.log" 2>&1 || bad "straight: $(cat "$T/a.log")"
cp "$T/adir/step-000000000002.ckpt" "$T/b.ckpt" # the 6-step run at step 2 (the schedule spans the 6)
"$TS" train --data "$T/fmj" "${common[@]}" --epochs 2 --max-steps 6 --resume "$T/b.ckpt" --checkpoint "$T/c.ckpt" > "$T/c.log" 2>&1 || bad "resume: $(cat "$T/c.log")"
expect_exit 0 "max abs difference" "$TS" ckpt diff "$T/a.ckpt" "$T/c.ckpt" --tol 0

# two DDP ranks, each reading its own shard (pad_last_batch keeps their step counts equal)
if "$TS" train --data "$T/fm" --model mlp --batch-size 16 --seed 1 --quiet --nproc 2 --timeout 60 --epochs 1 > "$T/d.log" 2>&1; then
  ok "train --data --nproc 2"
else
  bad "train --data --nproc 2: $(cat "$T/d.log")"
fi
grep -q "\[rank 0\] training mlp on $T/fm: 200 images, 7 batches of 16 per epoch per rank, 2 ranks" "$T/d.log" && ok "each rank has 7 batches of its 100-image shard" || bad "DDP banner: $(cat "$T/d.log")"

# ---- errors --------------------------------------------------------------------------------------
expect_exit 2 "data /no/such/dir" "$TS" train --data /no/such/dir
mkdir -p "$T/none/cls"
expect_exit 2 "no samples found" "$TS" train --data "$T/none" --max-steps 1
cp -r "$T/fmj" "$T/bad"
cp -r "$T/fm/test" "$T/bad/test" # a good test set: the bad file is met while training
victim=$(find "$T/bad/train" -name '*.jpg' | sort | head -1)
head -c 300 "$victim" > "$T/cut" && mv "$T/cut" "$victim"
expect_exit 1 "$(basename "$(dirname "$victim")")/$(basename "$victim")" "$TS" train --data "$T/bad" "${common[@]}" --epochs 1
rm -r "$T/bad/test" # no test/: the training images are the evaluation set, decoded first
expect_exit 2 "$(basename "$(dirname "$victim")")/$(basename "$victim"): corrupt JPEG" "$TS" train --data "$T/bad" "${common[@]}" --epochs 1
mkdir -p "$T/empty/a" "$T/empty/b"
cp "$(find "$T/fm/train" -name '*.png' | head -3 | tail -1)" "$T/empty/a/1.png"
cp "$(find "$T/fm/train" -name '*.png' | head -2 | tail -1)" "$T/empty/b/2.png"
: > "$T/empty/b/zero.png"
expect_exit 1 "zero.png: empty file" "$TS" data show "$T/empty" --batch-size 8 --out "$T/e.png"

# ---- the benchmark runs (its numbers are not checked here) -------------------------------------
expect_exit 0 "img/s (wall)" "$TS" bench loader "$T/fmj" --data-threads 1 --image-size 28 --gray --seconds 0.2

cli_summary
