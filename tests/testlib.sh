# tests/testlib.sh — what the command-line tests share: sourced (`. "$(dirname "$0")/testlib.sh"`), it
# counts checks in passes and fails, ok NAME / bad WHY print one line each, and cli_summary prints the
# count and returns non-zero when a check failed (the script's last command: its exit status).
fails=0; passes=0
ok()  { passes=$((passes+1)); echo "ok: $1"; }
bad() { fails=$((fails+1)); echo "FAIL: $1"; }
cli_summary() { echo "$passes passed, $fails failed"; [ "$fails" -eq 0 ]; }
