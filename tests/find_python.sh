#!/usr/bin/env bash
# tests/find_python.sh MODULE...: prints the first Python that imports every MODULE — $TS_PYTHON, the
# interop venv scripts/install-deps makes (.pyvenv/), python3 on PATH, Debian's /usr/bin/python3 — or
# prints nothing and exits 1. The interop tests skip (exit 77) when there is none.
root=$(cd "$(dirname "$0")/.." && pwd)
imports=$(printf 'import %s; ' "$@")
for py in ${TS_PYTHON:+"$TS_PYTHON"} "$root/.pyvenv/bin/python3" python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c "$imports" >/dev/null 2>&1; then
    command -v "$py"
    exit 0
  fi
done
exit 1
