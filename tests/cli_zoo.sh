#!/usr/bin/env bash
# The users' own networks from the command line: examples/custom_resnet.c (a hand-written residual
# network) trained with DDP over 2 ranks and reloaded from its checkpoint; `tessera train --model
# resnet18 --image-size 32` on an image folder with train/ and val/; `tessera eval` printing the
# accuracy the training printed (and, with --split train, the training images'); `tessera predict`
# naming classes; and the errors (unknown model,
# --image-size for a fixed-size model, folders without classes, val/ classes that differ, a data
# set with other classes than the checkpoint's, --decode mixed without a GPU). Seconds, not minutes; no
# timing is checked.
set -u
TS=${1:?usage: cli_zoo.sh path/to/tessera}
BIN=$(dirname "$TS")
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir
export OMP_NUM_THREADS=1

# ---- a network of your own, DDP over 2 ranks, checkpoint reloaded ------------------------------------
if [ -x "$BIN/example_custom_resnet" ]; then
  "$TS" run -n 2 -- "$BIN/example_custom_resnet" --max-steps 20 --batch 16 --checkpoint "$T/cr.ckpt" >"$T/cr.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] && ok "custom ResNet trained on 2 ranks" || bad "custom ResNet exited $rc: $(tail -5 "$T/cr.log")"
  grep -q "custom ResNet: .* 2 rank(s)" "$T/cr.log" && ok "DDP over 2 ranks" || bad "not 2 ranks: $(cat "$T/cr.log")"
  grep -q "reloaded $T/cr.ckpt: .* differ by at most 0$" "$T/cr.log" && ok "its checkpoint loads back (same logits)" \
    || bad "reload: $(cat "$T/cr.log")"
  grep -q "\[rank 1\] .*reloaded" "$T/cr.log" && bad "rank 1 reloaded" || ok "only rank 0 saves and reloads"
else
  bad "no $BIN/example_custom_resnet"
fi

# ---- ResNet-18 on an image folder (train/ and val/) ----------------------------------------------------
"$TS" data export fashion-mnist --format png --limit 120 --out "$T/fm" >/dev/null 2>&1 || bad "export"
mv "$T/fm/test" "$T/fm/val"
"$TS" train --model resnet18 --data "$T/fm" --image-size 32 --max-steps 6 --batch-size 16 --quiet \
  --checkpoint "$T/r18.ckpt" >"$T/train.log" 2>&1
rc=$?
[ $rc -eq 0 ] && ok "resnet18 trained on the folder" || bad "resnet18 train exited $rc: $(cat "$T/train.log")"
grep -q "training resnet18 on $T/fm: 120 images" "$T/train.log" && ok "reads train/" || bad "banner: $(cat "$T/train.log")"
grep -q "test accuracy .*top-5 .*(120 images)" "$T/train.log" && ok "evaluates on val/ with top-5" \
  || bad "no val/ evaluation: $(cat "$T/train.log")"
acc=$(sed -n 's/^epoch 1\/[0-9]*: .*test accuracy \([0-9.]*\)%, top-5 \([0-9.]*\)%.*/\1 \2/p' "$T/train.log")
"$TS" ckpt show "$T/r18.ckpt" >"$T/show.log" 2>&1
grep -q "model.fc.weight .*\[10, 512\]" "$T/show.log" && ok "fc has one row per class folder" \
  || bad "fc: $(grep fc.weight "$T/show.log")"
grep -q "data.classes" "$T/show.log" && ok "checkpoint records the class names" || bad "no data.classes"
out=$("$TS" eval --checkpoint "$T/r18.ckpt" --data "$T/fm" --confusion 1 2>&1); rc=$?
[ $rc -eq 0 ] && ok "tessera eval runs" || bad "eval exited $rc: $out"
eacc=$(sed -n 's/.* images, accuracy \([0-9.]*\)% .*top-5 \([0-9.]*\)%.*/\1 \2/p' <<<"$out")
[ -n "$acc" ] && [ "$acc" = "$eacc" ] && ok "eval prints the training's accuracy and top-5 ($acc)" \
  || bad "eval '$eacc' vs training '$acc': $out"
grep -q "^ *1_trouser " <<<"$out" && ok "confusion matrix names the classes" || bad "no confusion matrix: $out"
rows=$(grep -cE "^ *[0-9]_[a-z_]+ +[0-9]" <<<"$out")
[ "$rows" -eq 10 ] && ok "10 matrix rows" || bad "matrix rows: $rows"
out=$("$TS" predict --checkpoint "$T/r18.ckpt" --top 3 "$T/fm/val/8_bag/"*.png 2>&1); rc=$?
n=$(grep -c "^$T/fm/val/8_bag/[0-9]*.png: [0-9]_[a-z_]* [0-9.]*%, [0-9]_[a-z_]* [0-9.]*%, [0-9]_[a-z_]* [0-9.]*%$" <<<"$out")
[ $rc -eq 0 ] && [ "$n" -eq "$(ls "$T/fm/val/8_bag" | wc -l)" ] && ok "predict: 3 named classes per file" \
  || bad "predict ($rc): $out"

# ---- --split train: the training images, preprocessed for evaluation ---------------------------------
mkdir -p "$T/half" && cp -r "$T/fm/train" "$T/fm/val" "$T/half/"
for d in "$T/half/train/"*; do ls "$d" | sort | awk 'NR % 2 == 0' | while read -r f; do rm "$d/$f"; done; done
ntrain=$(find "$T/half/train" -name '*.png' | wc -l)
out=$("$TS" eval --checkpoint "$T/r18.ckpt" --data "$T/half" --split train --confusion 0 --json "$T/ev.json" 2>&1)
grep -q "on $T/half (training split): $ntrain images" <<<"$out" && ok "eval --split train reads train/ ($ntrain images)" \
  || bad "eval --split train: $out"
grep -q '"split": "train"' "$T/ev.json" && ok "the JSON names the split" || bad "json: $(cat "$T/ev.json")"
expect_exit 0 "on $T/half: 120 images" "$TS" eval --checkpoint "$T/r18.ckpt" --data "$T/half" --confusion 0
expect_exit 2 "unknown --split 'val' (expected test or train)" "$TS" eval --checkpoint "$T/r18.ckpt" --split val

# ---- the same network on IDX files through the pipeline (RGB crops of 28x28 gray images) ------------
"$TS" train --model resnet18 --image-size 32 --max-steps 2 --batch-size 8 --quiet --data "$DATA" \
  --checkpoint "$T/idx.ckpt" >"$T/idx.log" 2>&1 && ok "resnet18 on IDX files" || bad "IDX: $(cat "$T/idx.log")"
# and the reference CNN's training split (train-*-idx files) through --split train
"$TS" train --model cnn --max-steps 2 --batch-size 32 --quiet --data "$DATA" --checkpoint "$T/cnn.ckpt" \
  >"$T/cnn.log" 2>&1 || bad "cnn: $(cat "$T/cnn.log")"
expect_exit 0 "(training split): 60000 images" "$TS" eval --checkpoint "$T/cnn.ckpt" --data "$DATA" --split train --confusion 0
expect_exit 0 "on $DATA: 10000 images" "$TS" eval --checkpoint "$T/cnn.ckpt" --data "$DATA" --confusion 0
# --num-classes: more outputs than the data's classes (ImageNet's 1000 kept for fine-tuning), never fewer
"$TS" train --model mlp --num-classes 12 --max-steps 2 --quiet --data "$DATA" --checkpoint "$T/m12.ckpt" \
  >"$T/m12.log" 2>&1 || bad "mlp --num-classes 12: $(cat "$T/m12.log")"
"$TS" ckpt show "$T/m12.ckpt" 2>&1 | grep -q "^ *model.3.weight .*\[12, 256\]" && ok "--num-classes 12: 12 outputs" \
  || bad "--num-classes 12: $("$TS" ckpt show "$T/m12.ckpt" 2>&1 | grep model.3)"
expect_exit 0 "10000 images" "$TS" eval --checkpoint "$T/m12.ckpt" --data "$DATA" --confusion 0
"$TS" ckpt show "$T/m12.ckpt" 2>&1 | grep -q "train.num_classes.* 12" && ok "the checkpoint records 12 outputs" \
  || bad "no train.num_classes: $("$TS" ckpt show "$T/m12.ckpt" 2>&1 | grep num_classes)"
expect_exit 2 "num_classes 5: data $DATA has 10 classes" "$TS" train --model mlp --num-classes 5 --data "$DATA"

# ---- errors -----------------------------------------------------------------------------------------
expect_exit 2 "unknown model 'resnet19' (expected one of cnn, mlp, resnet18" "$TS" train --model resnet19
expect_exit 2 "image_size 64: model cnn takes 28x28 images only" "$TS" train --model cnn --image-size 64
mkdir -p "$T/empty/train" "$T/empty/val"
expect_exit 2 "$T/empty/train" "$TS" train --model resnet18 --image-size 32 --data "$T/empty"
cp -r "$T/fm" "$T/odd" && mv "$T/odd/val/3_dress" "$T/odd/val/3_gown"
expect_exit 2 "$T/odd/val: class folder 3 is '3_gown'" "$TS" train --model resnet18 --image-size 32 --data "$T/odd"
expect_exit 2 "class 3 is '3_gown', the checkpoint's is '3_dress'" "$TS" eval --checkpoint "$T/r18.ckpt" --data "$T/odd/val"
mkdir -p "$T/five" && for c in 0_tshirt_top 1_trouser 2_pullover; do cp -r "$T/fm/val/$c" "$T/five/"; done
expect_exit 0 "accuracy" "$TS" eval --checkpoint "$T/r18.ckpt" --data "$T/five" --confusion 0
expect_exit 2 "--checkpoint is required" "$TS" eval
expect_exit 2 "no image files given" "$TS" predict --checkpoint "$T/r18.ckpt"
expect_exit 1 "$T/nope.png" "$TS" predict --checkpoint "$T/r18.ckpt" "$T/nope.png"
# --decode mixed (nvJPEG on the training GPU): refused without a GPU to decode on
expect_exit 2 "decode mixed decodes the training images on the GPU the model trains on: give device cuda:N" \
  "$TS" train --model resnet18 --image-size 32 --data "$T/fm" --decode mixed
expect_exit 2 "cpu:1 has no image decoder" "$TS" train --model resnet18 --image-size 32 --data "$T/fm" --decode mixed \
  --device cpu:1
expect_exit 2 "unknown --decode 'gpu': expected cpu or mixed" "$TS" train --data "$T/fm" --decode gpu
expect_exit 2 "records no model name" "$TS" eval --checkpoint "$T/cr.ckpt"
expect_exit 2 "this is a resnet18 checkpoint; the model is mlp" "$TS" eval --checkpoint "$T/r18.ckpt" --model mlp
# a whole other model: one short line naming both, not a page of keys
out=$("$TS" eval --checkpoint "$T/cnn.ckpt" --model resnet18 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF "this is a cnn checkpoint; the model is resnet18" <<<"$out" && [ "${#out}" -lt 400 ] \
  && ok "eval --model resnet18 of a cnn checkpoint: '$out'" || bad "eval of another model ($rc, ${#out} chars): $out"
out=$("$TS" train --model resnet18 --image-size 32 --max-steps 1 --data "$T/fm" --init-from "$T/cnn.ckpt" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -qF "$T/cnn.ckpt: load_state_dict: this is a cnn checkpoint; the model is resnet18" <<<"$out" \
  && [ "${#out}" -lt 400 ] && ok "--init-from a cnn checkpoint into resnet18: one line" \
  || bad "--init-from another model ($rc, ${#out} chars): $out"

cli_summary
