"""tests/python/testutil.py: what every tests/python/test_*.py script asserts with (not a test itself: the
runner, tests/python_tests.sh, runs test_*.py; a script's folder is on its import path)."""
import sys


def check(cond, what):
    """Prints "ok: what", or "FAIL: what" and ends the script with status 1."""
    if not cond:
        print("FAIL:", what, flush=True)
        sys.exit(1)
    print("ok:", what, flush=True)


def raises(exc, needle, fn, *args, **kw):
    """fn(*args, **kw) raises exc, its message mentioning needle."""
    try:
        fn(*args, **kw)
    except exc as e:
        check(needle in str(e), f"{exc.__name__}: {str(e)[:170]}")
        return
    check(False, f"expected {exc.__name__} mentioning {needle!r}")
