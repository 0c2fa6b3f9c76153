#!/usr/bin/env bash
# `tessera env`: every section and registered variable listed, a set value shown as NAME=value and an unset one
# with its default, the job token hidden, a value that is not accepted named on stderr (and --check's exit
# status 1), --values, --json (one object per variable; parsed with Python's json module when
# tests/find_python.sh finds one), `tessera --help` listing the command, and the library's warning for a bad
# value in a real run (`tessera devices` with TS_CPU_DEVICES=many: once, and the default used).
set -u
TS=${1:?usage: cli_env.sh path/to/tessera}
HERE=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/testlib.sh"
PY=$(bash "$HERE/find_python.sh" json) || PY=""
# has TEXT NEEDLE WHAT
has()  { if grep -qF -- "$2" <<<"$1"; then ok "$3"; else bad "$3: no '$2' in: $1"; fi; }
unset TS_DIST_TIMEOUT TS_JOB_TOKEN TS_DIST_SPIN TS_CPU_DEVICES TS_LOG_LEVEL

"$TS" --help | grep -qE '^  env +' && ok "tessera --help lists env" || bad "tessera --help does not list env"

out=$("$TS" env 2>&1); rc=$?
[ "$rc" -eq 0 ] && ok "tessera env exits 0" || bad "tessera env exited $rc"
for s in "Numbers and kernels:" "Devices and memory:" "Input limits:" "Distributed:" "Logging:"; do has "$out" "$s" "section $s"; done
has "$out" "TS_DIST_TIMEOUT (default 1800)" "an unset variable shows its default"
has "$out" "TS_RUN_DIR (set by tessera run)" "a launcher's variable is marked"

out=$(TS_DIST_SPIN=17 TS_JOB_TOKEN=open-sesame "$TS" env 2>&1)
has "$out" "TS_DIST_SPIN=17" "a set variable shows its value"
has "$out" "TS_JOB_TOKEN=(set, hidden)" "the job token is hidden"
grep -qF open-sesame <<<"$out" && bad "the job token's value is printed" || ok "the job token's value is not printed"

err=$(TS_DIST_TIMEOUT=soon "$TS" env 2>&1 >/dev/null)
has "$err" "TS_DIST_TIMEOUT='soon' is not accepted: expected a number in [0.1, " "a bad value is named on stderr"
TS_DIST_TIMEOUT=soon "$TS" env --check >/dev/null 2>&1; rc=$?
[ "$rc" -eq 1 ] && ok "--check exits 1 on a value that is not accepted" || bad "--check exited $rc"
TS_DIST_TIMEOUT=60 "$TS" env --check >/dev/null 2>&1; rc=$?
[ "$rc" -eq 0 ] && ok "--check exits 0 when every value is accepted" || bad "--check exited $rc with good values"

out=$("$TS" env --values)
has "$out" "values: auto, shm, tcp (enum)" "--values shows an enum's names"
has "$out" "values: 0 or off, or a number in [0.5, " "--values shows a range"

json=$(TS_DIST_SPIN=9 "$TS" env --json)
n=$(grep -c '^  {"name": "TS_' <<<"$json")
[ "$n" -ge 30 ] && ok "--json lists $n variables, one a line" || bad "--json lists $n variables"
has "$json" '"name": "TS_DIST_SPIN", "section": "Distributed", "type": "int"' "--json names the type and section"
has "$json" '"value": "9"' "--json gives a set value"
if [ -n "$PY" ]; then
  if "$PY" -c 'import json, sys
d = json.load(sys.stdin)["variables"]
v = {x["name"]: x for x in d}
assert v["TS_DIST_SPIN"]["value"] == "9" and v["TS_DIST_TIMEOUT"]["value"] is None
assert v["TS_DIST_TIMEOUT"]["live"] and not v["TS_CONV_ALGO"]["live"] and v["TS_RUN_DIR"]["internal"]
assert all(x["doc"] and x["default"] and x["values"] for x in d)' <<<"$json"; then ok "--json is JSON with every field"
  else bad "--json does not parse or lacks fields"; fi
fi

# the library's own warning: once, naming the value and what is accepted, and the default used
out=$(TS_CPU_DEVICES=many "$TS" devices 2>&1)
n=$(grep -c "TS_CPU_DEVICES='many'" <<<"$out")
[ "$n" -eq 1 ] && ok "a bad TS_CPU_DEVICES warns once" || bad "a bad TS_CPU_DEVICES warned $n times: $out"
has "$out" "using the default (2)" "the warning says the default is used"
has "$out" "2 virtual CPU devices" "the default is used"

cli_summary
