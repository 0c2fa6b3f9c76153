#!/usr/bin/env bash
# The shape tools/ keeps: the `tessera` command is flag tables and printing over the library, so
#   1. no function in tools/*.c is longer than 100 lines (signature to closing brace);
#   2. no string literal in tools/ spells a checkpoint key ("train.", "data.", "model.", "optim."):
#      the layout is the trainer's (src/train/ckpt_keys.h), read through tessera/train.h's accessors.
# Run by ctest with the tessera binary as $1 (unused: this reads the sources).
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/testlib.sh"
MAX=100

# top-level function definitions: a line at column 0 with '(' and no '=' opens a candidate (a prototype ends
# at ';'); the first line ending in '{' makes it a definition, which a '}' at column 0 closes
long=$(for f in "$SRC"/tools/*.c; do
  awk -v max=$MAX -v file="tools/$(basename "$f")" '
    !infn && /^[A-Za-z_]/ && /\(/ && !/=/ { cand = FNR; name = $0 }
    !infn && cand && /;[[:space:]]*$/ { cand = 0 }
    !infn && cand && /\{[[:space:]]*$/ { infn = 1; start = cand; next }
    infn && /^\}/ { n = FNR - start + 1; if (n > max) printf "%s:%d: %d lines: %s\n", file, start, n, name; infn = 0; cand = 0 }
  ' "$f"
done)
[ -z "$long" ] && ok "every function in tools/ is at most $MAX lines" \
  || bad "functions over $MAX lines:
$long"

# the checker finds a long function (so a broken pattern cannot pass silently)
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
{ echo "static int f(int a,"; echo "             int b) {"; for i in $(seq 1 120); do echo "    a++;"; done; echo "}"; } > "$T/x.c"
awk -v max=$MAX '
  !infn && /^[A-Za-z_]/ && /\(/ && !/=/ { cand = FNR; name = $0 }
  !infn && cand && /;[[:space:]]*$/ { cand = 0 }
  !infn && cand && /\{[[:space:]]*$/ { infn = 1; start = cand; next }
  infn && /^\}/ { n = FNR - start + 1; if (n > max) print n; infn = 0; cand = 0 }
' "$T/x.c" | grep -qx 123 && ok "the length check sees a 123-line function" || bad "the length check is blind"

keys=$(grep -nE '"(train|data|model|optim)\.[a-z_]*' "$SRC"/tools/*.c "$SRC"/tools/*.h)
[ -z "$keys" ] && ok "no checkpoint key spelled in tools/" || bad "checkpoint keys spelled in tools/:
$keys"

cli_summary
