#!/usr/bin/env bash
# `tessera train --trace / --metrics-csv` and `tessera trace merge`: a 2-rank DDP run on Fashion-MNIST
# writes trace.rank0.json and trace.rank1.json (valid JSON; forward, backward, optimizer step, data wait
# and bucket all-reduces with their bytes; on rank 0 an all-reduce overlaps a backward in time), rank 0
# writes 20 CSV rows under the header; merge puts both ranks (pids 0 and 1) on one timeline and names
# the file and what is wrong when an input is not a trace or has no wall-clock zero. The JSON checks use
# Python's json module when tests/find_python.sh finds a Python (grep checks otherwise).
set -u
TS=${1:?usage: cli_trace.sh path/to/tessera}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/testlib.sh"
need_fashion_mnist
test_tmpdir
PY=$(bash "$HERE/find_python.sh" json) || PY=""

# expect_exit CODE NEEDLE CMD...: exit status CODE and stderr+stdout mentioning NEEDLE

expect_exit 0 "trace.rank0.json" "$TS" train --help
expect_exit 0 "merge" "$TS" trace --help
expect_exit 2 "unknown subcommand 'split'" "$TS" trace split

# ---- two ranks
"$TS" train --nproc 2 --max-steps 20 --epochs 1 --quiet --timeout 120 --trace "$T/trace.json" \
  --metrics-csv "$T/m.csv" > "$T/train.log" 2>&1 || bad "2-rank run failed: $(tail -5 "$T/train.log")"
for r in 0 1; do
  f="$T/trace.rank$r.json"
  if [ ! -f "$f" ]; then bad "no $f"; continue; fi
  for name in step forward backward "optimizer step" "data wait" allreduce "allreduce wait"; do
    grep -q "\"name\":\"$name\",\"cat\"" "$f" && ok "rank $r: $name events" || bad "rank $r: no $name event"
  done
  grep -q '"name":"allreduce","cat":"comm","ts":[0-9.]*,"dur":[0-9.]*,"args":{"bucket":[0-9]*,"bytes":[1-9]' "$f" \
    && ok "rank $r: all-reduces carry bucket and bytes" || bad "rank $r: all-reduce events without bytes"
done
[ ! -e "$T/trace.json" ] && ok "several ranks: no unsuffixed trace.json" || bad "trace.json written by a rank"
if [ -n "$PY" ]; then
  # valid JSON; the overlap of all-reduces with backward on rank 0, and how much of it with backward's compute
  # (before the last gradient, where DDP's end-of-pass wait begins)
  out=$("$PY" - "$T/trace.rank0.json" "$T/trace.rank1.json" <<'EOF' 2>&1
import json, sys
for i, path in enumerate(sys.argv[1:]):
    d = json.load(open(path))
    assert d["otherData"]["rank"] == i and d["otherData"]["world_size"] == 2, d["otherData"]
    assert d["otherData"]["wall_clock_zero_us"] > 1e15, d["otherData"]
    ev = [e for e in d["traceEvents"] if e["ph"] == "X"]
    assert all(e["pid"] == i for e in d["traceEvents"]), "pid is not the rank"
    span = lambda n: [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == n]
    bw, wait = span("backward"), span("allreduce wait")
    ar = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "allreduce" and e["tid"] == 1]
    assert len(span("step")) == 20 and len(bw) == 20, (len(span("step")), len(bw))
    over = lambda a, b, ints: sum(max(0.0, min(b, y) - max(a, x)) for x, y in ints)
    total = sum(b - a for a, b in ar)
    in_bw = sum(over(a, b, bw) for a, b in ar)
    in_wait = sum(over(a, b, wait) for a, b in ar)
    overlapping = sum(1 for a, b in ar if over(a, b, bw) > 0)
    print("rank %d: %d all-reduces, %.1f ms; %.0f%% inside backward, %.0f%% alongside backward's compute "
          "(before the last gradient)" % (i, len(ar), total / 1e3, 100 * in_bw / total, 100 * (in_bw - in_wait) / total))
    if i == 0:
        assert overlapping > 0, "no all-reduce overlaps a backward on rank 0"
EOF
)
  if [ $? -eq 0 ]; then ok "traces are JSON, an all-reduce overlaps backward on rank 0:"; echo "$out"; else bad "trace check: $out"; fi
fi

# ---- the CSV: header + 20 rows of 7 fields, steps 1..20
if [ -f "$T/m.csv" ]; then
  [ "$(head -1 "$T/m.csv")" = "step,epoch,loss,lr,images_per_second,data_wait_share,allreduce_seconds" ] \
    && ok "CSV header" || bad "CSV header: $(head -1 "$T/m.csv")"
  rows=$(tail -n +2 "$T/m.csv" | awk -F, 'NF == 7 && $1 == NR && $2 == 1 && $5 > 0 && $6 >= 0 && $6 <= 1 && $7 > 0' | wc -l)
  [ "$rows" -eq 20 ] && [ "$(wc -l < "$T/m.csv")" -eq 21 ] && ok "CSV: 20 rows" \
    || bad "CSV rows ($rows good): $(cat "$T/m.csv")"
else
  bad "no $T/m.csv"
fi

# ---- merge
expect_exit 0 "merged 2 traces" "$TS" trace merge "$T/all.json" "$T/trace.rank0.json" "$T/trace.rank1.json"
if [ -f "$T/all.json" ]; then
  grep -q '"pid":0,' "$T/all.json" && grep -q '"pid":1,' "$T/all.json" && ok "merged: pids 0 and 1" \
    || bad "merged file lacks a pid"
  if [ -n "$PY" ]; then
    out=$("$PY" - "$T/all.json" "$T/trace.rank0.json" "$T/trace.rank1.json" <<'EOF' 2>&1
import json, sys
m, a, b = (json.load(open(p)) for p in sys.argv[1:])
assert {e["pid"] for e in m["traceEvents"]} == {0, 1}
assert len(m["traceEvents"]) == len(a["traceEvents"]) + len(b["traceEvents"])
za, zb = a["otherData"]["wall_clock_zero_us"], b["otherData"]["wall_clock_zero_us"]
z = min(za, zb)
assert abs(m["otherData"]["wall_clock_zero_us"] - z) < 1e-3
# rank 1's first step moved by its zero's distance from the earliest
s1 = min(e["ts"] for e in b["traceEvents"] if e.get("name") == "step")
m1 = min(e["ts"] for e in m["traceEvents"] if e.get("name") == "step" and e["pid"] == 1)
assert abs(m1 - (s1 + (zb - z))) < 0.01, (m1, s1, zb - z)
print("rank 1 shifted by %.3f ms" % ((zb - z) / 1e3))
EOF
)
    [ $? -eq 0 ] && ok "merged: one JSON timeline ($out)" || bad "merged check: $out"
  fi
fi
echo '{"traceEvents": [], "otherData": {}}' > "$T/nozero.json"
expect_exit 1 "nozero.json: no wall-clock zero" "$TS" trace merge "$T/out.json" "$T/nozero.json"
echo '{"traceEvents": [{"ph":"X",}]}' > "$T/broken.json"
expect_exit 1 "broken.json: not a trace" "$TS" trace merge "$T/out.json" "$T/broken.json"
echo '[1, 2]' > "$T/array.json"
expect_exit 1 "array.json: not a trace" "$TS" trace merge "$T/out.json" "$T/array.json"
expect_exit 1 "missing.json" "$TS" trace merge "$T/out.json" "$T/missing.json"
expect_exit 1 "are both rank 0" "$TS" trace merge "$T/out.json" "$T/trace.rank0.json" "$T/trace.rank0.json"
expect_exit 2 "needs OUT and at least one IN" "$TS" trace merge "$T/out.json"
[ ! -e "$T/out.json" ] && ok "failed merges leave no output" || bad "a failed merge left $T/out.json"

# ---- one process: the file name as given; pipeline stages on their lanes
"$TS" train --strategy pipeline --devices cpu:0,cpu:1 --max-steps 3 --epochs 1 --quiet --trace "$T/pp.json" \
  > "$T/pp.log" 2>&1 || bad "pipeline run failed: $(tail -5 "$T/pp.log")"
if [ -f "$T/pp.json" ]; then
  grep -q '"tid":3,"name":"backward","cat":"device".*"micro_batch":7,"stage":1' "$T/pp.json" \
    && ok "pipeline: stage 1's backward of micro-batch 7 on its lane" || bad "pipeline: no stage events"
else
  bad "one process: no $T/pp.json"
fi
# DataParallel: each replica's forward and backward on its device's lane
"$TS" train --strategy data --devices cpu:0,cpu:1 --max-steps 3 --epochs 1 --quiet --trace "$T/dp.json" \
  > "$T/dp.log" 2>&1 || bad "data-parallel run failed: $(tail -5 "$T/dp.log")"
grep -q '"tid":3,"name":"backward","cat":"device".*"replica":1' "$T/dp.json" 2>/dev/null \
  && grep -q 'DataParallel replica 1 (cpu:1)' "$T/dp.json" \
  && ok "data parallel: replica 1's backward on its lane" || bad "data parallel: no replica events"
expect_exit 2 "metrics_csv: $T/no/m.csv: cannot save a metrics CSV file there: directory $T/no" "$TS" train --max-steps 2 --epochs 1 --quiet --metrics-csv "$T/no/m.csv"
# output paths that cannot be written fail before training, as a usage error (exit 2)
expect_exit 2 "trace: $T/no/t.json: cannot save a trace there" "$TS" train --max-steps 2 --epochs 1 --quiet --trace "$T/no/t.json"

cli_summary
