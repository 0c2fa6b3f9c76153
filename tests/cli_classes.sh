#!/usr/bin/env bash
# Class names for IDX data, end to end: a few training steps on Debian's Fashion-MNIST (recognised by its
# content) store the names in the checkpoint (data.classes), `tessera predict` prints them ("Sneaker", not
# "class 7"), `tessera eval` accepts the exported image folders ("7_sneaker") as the same classes; a copy
# of the files with a classes.txt beside them is named from it, and a classes.txt that names too few
# classes is refused naming the file. Seconds, not minutes; no timing is checked.
set -u
TS=${1:?usage: cli_classes.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir
export OMP_NUM_THREADS=1
NAMES='T-shirt/top|Trouser|Pullover|Dress|Coat|Sandal|Shirt|Sneaker|Bag|Ankle boot'

# ---- Fashion-MNIST: trained a few steps, the checkpoint names the classes ----------------------------
"$TS" train --model cnn --max-steps 2 --batch-size 32 --quiet --data "$DATA" --checkpoint "$T/cnn.ckpt" \
  >"$T/train.log" 2>&1 || bad "train: $(cat "$T/train.log")"
"$TS" ckpt show "$T/cnn.ckpt" >"$T/show.log" 2>&1
grep -q "data.classes .*76 bytes" "$T/show.log" && ok "the checkpoint stores the 10 names (76 bytes)" \
  || bad "no data.classes: $(cat "$T/show.log")"
"$TS" data export fashion-mnist --limit 20 --out "$T/fm" >/dev/null 2>&1 || bad "export"
out=$("$TS" predict --checkpoint "$T/cnn.ckpt" --top 3 "$T/fm/test/7_sneaker/"*.png 2>&1); rc=$?
n=$(grep -cE "^$T/fm/test/7_sneaker/[0-9]+\.png: ($NAMES) [0-9.]+%, ($NAMES) [0-9.]+%, ($NAMES) [0-9.]+%$" <<<"$out")
[ $rc -eq 0 ] && [ "$n" -ge 1 ] && [ "$n" -eq "$(ls "$T/fm/test/7_sneaker" | wc -l)" ] \
  && ok "predict prints Fashion-MNIST's names ($n files)" || bad "predict ($rc): $out"
grep -q "class [0-9]" <<<"$out" && bad "an unnamed class: $out" || ok "no 'class N'"
# all ten classes, so every name shows up
out=$("$TS" predict --checkpoint "$T/cnn.ckpt" --top 10 "$T/fm/test/7_sneaker/"*.png 2>&1)
for nm in "T-shirt/top" "Sneaker" "Ankle boot"; do
  grep -qF " $nm " <<<"$out" && ok "'$nm' among the names" || bad "'$nm' missing: $out"
done
# the exported folders (0_tshirt_top ... 9_ankle_boot) are the checkpoint's classes
out=$("$TS" eval --checkpoint "$T/cnn.ckpt" --data "$T/fm" --confusion 1 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "accuracy" <<<"$out" && ok "eval on the exported folders" || bad "eval ($rc): $out"
grep -q "^ *Sneaker " <<<"$out" && ok "the confusion matrix names the rows" || bad "matrix: $out"
mv "$T/fm/test/7_sneaker" "$T/fm/test/7_boots"
mv "$T/fm/train/7_sneaker" "$T/fm/train/7_boots"
out=$("$TS" eval --checkpoint "$T/cnn.ckpt" --data "$T/fm" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -qF "class 7 is '7_boots', the checkpoint's is 'Sneaker'" <<<"$out" \
  && ok "another class folder is still refused" || bad "renamed folder ($rc): $out"

# ---- the ResNet path (IDX files through the pipeline) names them too -----------------------------------
"$TS" train --model resnet18 --image-size 32 --max-steps 1 --batch-size 8 --quiet --data "$DATA" \
  --checkpoint "$T/r18.ckpt" >"$T/r18.log" 2>&1 || bad "resnet18: $(cat "$T/r18.log")"
"$TS" ckpt show "$T/r18.ckpt" 2>&1 | grep -q "data.classes .*76 bytes" && ok "resnet18 on IDX: named" \
  || bad "resnet18 checkpoint: $("$TS" ckpt show "$T/r18.ckpt" 2>&1 | grep data)"

# ---- classes.txt beside the IDX files ------------------------------------------------------------------
mkdir -p "$T/own"
cp "$DATA"/t10k-* "$DATA"/train-* "$T/own/"
printf 'top\ntrousers\npullover\ndress\ncoat\nsandal\nshirt\ntrainer\nbag\nboot\n' >"$T/own/classes.txt"
"$TS" train --model mlp --max-steps 1 --quiet --data "$T/own" --checkpoint "$T/own.ckpt" >"$T/own.log" 2>&1 \
  || bad "train with classes.txt: $(cat "$T/own.log")"
out=$("$TS" predict --checkpoint "$T/own.ckpt" --top 10 "$T/fm/test/8_bag/"*.png 2>&1)
grep -q " trainer [0-9.]*%" <<<"$out" && ok "classes.txt names the classes" || bad "classes.txt: $out"
printf 'top\ntrousers\n' >"$T/own/classes.txt"
out=$("$TS" train --model mlp --max-steps 1 --quiet --data "$T/own" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -qF "$T/own/classes.txt names 2 classes, but a label is 9" <<<"$out" \
  && ok "too few names: refused naming the file" || bad "short classes.txt ($rc): $out"

cli_summary
