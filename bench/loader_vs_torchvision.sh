#!/usr/bin/env bash
# bench/loader_vs_torchvision.sh [BUILD_DIR] — the input pipeline beside raw libjpeg-turbo decoding,
# beside PyTorch's DataLoader with torchvision (Debian's python3-torch / python3-torchvision) and beside
# NVIDIA DALI's CPU pipeline (pip's nvidia-dali-cuda130 in $DALI_PY, default python3; left out when it
# cannot import nvidia.dali), in one run, on two data sets:
#   photos   real photographs (Debian's mate-backgrounds) cut into 500x375 JPEG crops (ImageNet-sized),
#            random resized crop to 224x224 RGB, flip, normalise
#   fmnist   Fashion-MNIST exported as 28x28 gray JPEGs (tessera data export), random resized crop to 28x28
# For each thread count T: `tessera bench loader` (T pipeline workers; raw libjpeg-turbo decoding with T
# threads, of files in memory and of files read each time), DataLoader(num_workers=T) and a DALI
# pipeline with num_threads=T (readers.file -> decoders.image_random_crop -> resize ->
# crop_mirror_normalize with a coin_flip mirror), alternating, best of REPS runs for each rate. Prints a Markdown
# table; "per CPU-second" rates divide by the CPU time the process (and the DataLoader's worker
# processes) used, every thread counted, so they hold on a machine shared with other work.
# Environment: THREADS (default "1 2"), REPS (default 3), SECONDS_PER_RUN (default 4), TS_BENCH_DIR,
# DALI_PY (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TS=$BUILD/tessera
PY=/usr/bin/python3 # Debian's python with torch (the default python3 may be another one)
THREADS=${THREADS:-1 2}
REPS=${REPS:-3}
SECS=${SECONDS_PER_RUN:-4}
WORK=${TS_BENCH_DIR:-/tmp/tessera-bench-loader}
DALI_PY=${DALI_PY:-python3}
if ! "$DALI_PY" -c 'import nvidia.dali' 2> /dev/null; then
  echo "loader_vs_torchvision: $DALI_PY cannot import nvidia.dali (pip install nvidia-dali-cuda130): no DALI column" >&2
  DALI_PY=
fi
TS_WITH_BENCH=1 scripts/install-deps
# tessera.data (the build's Python package) beside them, where the extension was built
PYEXT=$BUILD/python
ls "$PYEXT"/tessera/_tessera*.so > /dev/null 2>&1 || { echo "loader_vs_torchvision: no $PYEXT/tessera: no Python column" >&2; PYEXT=; }
[ -x "$TS" ] || cmake --build "$BUILD" -j "$(nproc)" --target tessera
mkdir -p "$WORK"
[ -d "$WORK/photos" ] || $PY bench/loader_vs_torchvision.py make-photos --out "$WORK/photos"
[ -d "$WORK/fmnist" ] || "$TS" data export fashion-mnist --format jpeg --split train --limit 20000 --out "$WORK/fmnist"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for set in photos fmnist; do
  if [ "$set" = photos ]; then targs=(--image-size 224); pargs=(--size 224); else targs=(--image-size 28 --gray); pargs=(--size 28 --gray); fi
  for t in $THREADS; do
    for r in $(seq "$REPS"); do
      echo "== $set, $t threads, run $r" >&2
      printf '%s ' "$set" >> "$out"; "$TS" bench loader "$WORK/$set" --data-threads "$t" --seconds "$SECS" --json "${targs[@]}" >> "$out"
      printf '%s ' "$set" >> "$out"; $PY bench/loader_vs_torchvision.py run "$WORK/$set" --threads "$t" --seconds "$SECS" "${pargs[@]}" >> "$out"
      if [ -n "$PYEXT" ]; then
        printf '%s ' "$set" >> "$out"; PYTHONPATH=$PYEXT $PY bench/loader_vs_torchvision.py python "$WORK/$set" --threads "$t" --seconds "$SECS" "${pargs[@]}" >> "$out"
      fi
      if [ -n "$DALI_PY" ]; then
        printf '%s ' "$set" >> "$out"; "$DALI_PY" bench/loader_vs_torchvision.py dali "$WORK/$set" --threads "$t" --seconds "$SECS" "${pargs[@]}" >> "$out"
      fi
    done
  done
done

$PY - "$out" <<'PYEOF'
import json, sys
best = {}  # per (set, threads, framework): the best of the runs, each rate on its own
for line in open(sys.argv[1]):
    name, js = line.split(" ", 1)
    r = json.loads(js)
    b = best.setdefault((name, r["threads"], r["framework"]), dict(r))
    for k, v in r.items():
        if k.endswith("per_second") or k.endswith("per_cpu_second"):
            b[k] = max(b[k], v)
nan = float("nan")
print("| data set | threads | raw decode | raw read+decode | Tessera pipeline | Tessera from Python | torchvision | DALI "
      "| per CPU-second: raw decode | raw read+decode | Tessera | Tessera from Python | torchvision | DALI "
      "| Tessera / raw decode | Tessera / raw read+decode | Tessera / DALI | Python: / DALI | / torchvision |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for (name, t, fw), r in sorted(best.items()):
    if fw != "tessera":
        continue
    tv, dl = best.get((name, t, "torchvision"), {}), best.get((name, t, "dali"), {})
    py = best.get((name, t, "tessera-python"), {})
    pps, cpy = py.get("images_per_second", nan), py.get("images_per_cpu_second", nan)
    raw, rr, ips = r["raw_decode_images_per_second"], r["raw_read_decode_images_per_second"], r["images_per_second"]
    craw, crr, cips = (r["raw_decode_images_per_cpu_second"], r["raw_read_decode_images_per_cpu_second"],
                       r["images_per_cpu_second"])
    ctv, cdl = tv.get("images_per_cpu_second", nan), dl.get("images_per_cpu_second", nan)
    print(f"| {name} ({r['files']} files, {r['channels']}x{r['size']}x{r['size']}) | {t} | {raw:.0f} | {rr:.0f} | {ips:.0f} "
          f"| {pps:.0f} | {tv.get('images_per_second', nan):.0f} | {dl.get('images_per_second', nan):.0f} "
          f"| {craw:.0f} | {crr:.0f} | {cips:.0f} | {cpy:.0f} | {ctv:.0f} | {cdl:.0f} "
          f"| {cips/craw:.2f} | {cips/crr:.2f} | {cips/cdl:.1f} | {cpy/cdl:.1f} | {cpy/ctv:.1f} |")
print("(images/s and images per CPU-second of the process and its workers, each the best of the runs; "
      "'from Python': tessera.data.ImagePipeline, each batch handed to torch through DLPack)")
PYEOF
