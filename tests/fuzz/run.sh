#!/usr/bin/env bash
# tests/fuzz/run.sh BINARY CORPUS RUNS [libFuzzer flags...] — one short libFuzzer run (ctest; bench/fuzz.sh
# runs long ones). New inputs go to a temporary directory (the committed seeds stay as they are); a
# crash leaves fuzz-<target>-crash-* in the working directory. Exit 77 (skipped) when BINARY was not
# built: no clang with libFuzzer, or a gcc sanitizer build (see tests/fuzz/fuzz.cmake).
set -euo pipefail
bin=$1 corpus=$2 runs=$3
shift 3
if [ ! -x "$bin" ]; then
  echo "skipped: $bin was not built (needs clang with libFuzzer: apt-get install clang libclang-rt-dev;" \
       "not built in sanitizer builds)"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
name=$(basename "$bin")
dict=()
[ -f "$(dirname "$0")/${name#fuzz_}.dict" ] && dict=(-dict="$(dirname "$0")/${name#fuzz_}.dict")
"$bin" "${dict[@]}" -runs="$runs" -max_len=4096 -timeout=30 -rss_limit_mb=2560 -print_final_stats=1 \
  -artifact_prefix="$PWD/$name-" "$@" "$work" "$corpus" 2>&1 | tail -n 25
exit "${PIPESTATUS[0]}"
