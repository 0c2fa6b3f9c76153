#!/usr/bin/env bash
# bench/fuzz.sh [BUILD] [RUNS] [TARGET...] — long libFuzzer runs of the parsers' targets (tests/fuzz/).
#
#   bench/fuzz.sh                         # build/, 1000000 inputs for each of ckpt idx image store safetensors json
#   bench/fuzz.sh build 5000000 image     # one target, longer
#   TS_FUZZ_SECONDS=600 bench/fuzz.sh     # a time budget per target instead (-max_total_time)
#
# Needs clang with libFuzzer (`TS_WITH_FUZZ=1 scripts/install-deps`) and a non-sanitizer build (the
# targets carry their own ASan/UBSan). Each target keeps the inputs it found in BUILD/fuzz/corpus_<t>
# (seeded from tests/fuzz/corpus/<t>; copy small, interesting ones there to keep them) and writes a
# crashing input to BUILD/fuzz/<t>-crash-*: rerun it with `BUILD/fuzz/fuzz_<t> FILE`. tests/fuzz/<t>.dict,
# when present, is the target's libFuzzer dictionary (tests/fuzz/run.sh uses it too). Prints, per
# target, the inputs executed, the rate, the coverage and the crashes found; exits 1 if any crashed.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
RUNS=${2:-1000000}
shift $(( $# > 2 ? 2 : $# ))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(ckpt idx image store safetensors json)
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" --target fuzz >/dev/null || {
  echo "bench/fuzz.sh: no fuzz targets in $BUILD (clang with libFuzzer missing, or a sanitizer build?)" >&2
  exit 2
}
limit=(-runs="$RUNS")
[ -n "${TS_FUZZ_SECONDS:-}" ] && limit=(-max_total_time="$TS_FUZZ_SECONDS")
status=0
printf "%-8s %12s %10s %8s %8s %8s %s\n" target executions exec/s cov features crashes seconds
for t in "${targets[@]}"; do
  bin=$BUILD/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "bench/fuzz.sh: $bin is missing" >&2; status=2; continue; }
  mkdir -p "$BUILD/fuzz/corpus_$t"
  log=$BUILD/fuzz/$t.log
  dict=()
  [ -f "$SRC/tests/fuzz/$t.dict" ] && dict=(-dict="$SRC/tests/fuzz/$t.dict")
  t0=$(date +%s)
  "$bin" "${limit[@]}" "${dict[@]}" -max_len=4096 -timeout=30 -rss_limit_mb=2560 -print_final_stats=1 \
    -artifact_prefix="$BUILD/fuzz/$t-" "$BUILD/fuzz/corpus_$t" "$SRC/tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  crashes=$(find "$BUILD/fuzz" -maxdepth 1 -name "$t-crash-*" -newer "$log" -o -maxdepth 1 -name "$t-leak-*" -newer "$log" \
            -o -maxdepth 1 -name "$t-timeout-*" -newer "$log" -o -maxdepth 1 -name "$t-oom-*" -newer "$log" | wc -l)
  [ $rc -ne 0 ] && crashes=$(( crashes > 0 ? crashes : 1 ))
  printf "%-8s %12s %10s %8s %8s %8s %s\n" "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$crashes" "$secs"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -n 5 | sed 's/^/    /'
  fi
done
exit $status
