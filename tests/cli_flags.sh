#!/usr/bin/env bash
# One concept, one flag name across every `tessera <command> --help`: the image side is --image-size, images
# per step or batch --batch-size, the input pipeline's worker threads --data-threads, the model's outputs
# --num-classes (tessera train's spellings); no command lists another spelling of them. The old spellings of
# `data show` (--size, --batch, --threads), `bench loader` (--size, --threads) and `bench train` (--classes)
# still work as hidden aliases. Seconds; no timing is checked.
set -u
TS=${1:?usage: cli_flags.sh path/to/tessera}
. "$(dirname "$0")/testlib.sh"
test_tmpdir

cmds=("train" "eval" "predict" "bench train" "bench loader" "bench gemm" "ckpt show" "ckpt export" "ckpt import"
      "data export" "data show" "export" "devices" "run")
# flags of every command, as "command: --flag" lines
for c in "${cmds[@]}"; do
  # shellcheck disable=SC2086
  "$TS" $c --help 2>&1 | sed -nE 's/^  (--[a-z0-9-]+).*/\1/p' | sed "s/^/$c: /"
done >"$T/flags.txt"
[ "$(wc -l <"$T/flags.txt")" -gt 60 ] && ok "$(wc -l <"$T/flags.txt") flags listed" || bad "flags: $(cat "$T/flags.txt")"
for c in train "data show" "bench loader" "bench train"; do
  grep -q "^$c: --image-size$" "$T/flags.txt" && ok "$c: --image-size" || bad "$c has no --image-size"
  grep -q "^$c: --batch-size$" "$T/flags.txt" && ok "$c: --batch-size" || bad "$c has no --batch-size"
done
for c in train eval "data show" "bench loader"; do
  grep -q "^$c: --data-threads$" "$T/flags.txt" && ok "$c: --data-threads" || bad "$c has no --data-threads"
done
for c in train "bench train" "ckpt import"; do
  grep -q "^$c: --num-classes$" "$T/flags.txt" && ok "$c: --num-classes" || bad "$c has no --num-classes"
done
# the other spellings of those concepts appear nowhere (bench gemm's --size is a matrix's side)
odd=$(grep -E ": --(size|batch|classes|workers|num-threads|data-workers|img-size|imgsz)$" "$T/flags.txt" |
      grep -v "^bench gemm: --size$")
[ -z "$odd" ] && ok "no other spelling of image size, batch size, classes or data threads" || bad "other spellings: $odd"
# pipeline worker threads are never plain --threads (that is the CPU threads of the math)
thr=$("$TS" data show --help 2>&1; "$TS" bench loader --help 2>&1)
grep -E "^  --threads " <<<"$thr" && bad "--threads for pipeline workers" || ok "pipeline workers are --data-threads"

# ---- the old spellings still work, hidden -------------------------------------------------------------
mkdir -p "$T/img/a" "$T/img/b"
if "$TS" data export fashion-mnist --limit 8 --split train --out "$T/fm" >/dev/null 2>&1; then
  out=$("$TS" data show "$T/fm" --batch 4 --size 32 --threads 1 --out "$T/old.png" 2>&1)
  grep -q "wrote $T/old.png: 4 images of 32x32" <<<"$out" && ok "data show --batch --size --threads (old spellings)" \
    || bad "old spellings: $out"
  out=$("$TS" data show "$T/fm" --batch-size 4 --image-size 32 --data-threads 1 --out "$T/new.png" 2>&1)
  grep -q "wrote $T/new.png: 4 images of 32x32" <<<"$out" && ok "data show --batch-size --image-size --data-threads" \
    || bad "new spellings: $out"
  cmp -s "$T/old.png" "$T/new.png" && ok "the same grid either way" || bad "the grids differ"
else
  echo "skip: no Fashion-MNIST to export (data show not run)"
fi
"$TS" bench train --classes 7 --steps 1 --warmup 0 --batch-size 2 --json >"$T/b.json" 2>&1 && ok "bench train --classes" \
  || bad "bench train --classes: $(cat "$T/b.json")"
out=$("$TS" data show --help 2>&1)
grep -qE "^  --(size|batch|threads) " <<<"$out" && bad "an alias is listed: $out" || ok "aliases are not listed"
out=$("$TS" data show "$T/img" --sise 3 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown flag '--sise'" <<<"$out" && ok "unknown flags are still refused" || bad "--sise ($rc): $out"

cli_summary
