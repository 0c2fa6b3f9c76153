# tests/testlib.sh — what the command-line tests share: sourced (`. "$(dirname "$0")/testlib.sh"`), it
# counts checks in passes and fails, ok NAME / bad WHY print one line each, and cli_summary prints the
# count and returns non-zero when a check failed (the script's last command: its exit status);
# need_fashion_mnist and test_tmpdir below set DATA and T.
fails=0; passes=0
ok()  { passes=$((passes+1)); echo "ok: $1"; }
bad() { fails=$((fails+1)); echo "FAIL: $1"; }
cli_summary() { echo "$passes passed, $fails failed"; [ "$fails" -eq 0 ]; }
# expect_exit RC NEEDLE CMD...: CMD exits with status RC and its output (stdout and stderr) holds NEEDLE ("": any);
# with EXPECT_TIMEOUT=S set, CMD is killed after S seconds (timeout's status 124 then fails the check)
expect_exit() {
  local want=$1 needle=$2; shift 2
  local out rc
  if [ -n "${EXPECT_TIMEOUT:-}" ]; then out=$(timeout "$EXPECT_TIMEOUT" "$@" 2>&1); else out=$("$@" 2>&1); fi; rc=$?
  if [ "$rc" -ne "$want" ]; then bad "'$*' exited $rc, expected $want: $(tail -c 2000 <<<"$out")"; return; fi
  if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; then bad "'$*' output lacks '$needle': $out"; return; fi
  ok "$* -> $rc"
}
# need_fashion_mnist: DATA is the installed Fashion-MNIST, or the test skips (77) saying it is missing
need_fashion_mnist() {
  DATA=/usr/share/datasets/fashion-mnist
  [ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "skip: no $DATA"; exit 77; }
}
# test_tmpdir: T is a new folder, removed when the script exits
test_tmpdir() { T=$(mktemp -d); trap 'rm -rf "$T"' EXIT; }
