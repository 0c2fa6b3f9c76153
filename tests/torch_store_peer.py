"""tests/torch_store_peer.py — the PyTorch side of tests/test_store_torch.c.

Serves a real torch.distributed.TCPStore (is_master=True) on a free port (with the
argument "classic": torch 2.x's classic server rather than its libuv one; "skip: ..."
where there is no such choice), prints the port, and checks what tessera's client (src/distributed/store_torch.c) does
against it: keys it set are visible to torch under the same names, counters it
added read back, and the rendezvous keys its process groups left, with torch's
own client on the same server after tessera probed which generation of the
protocol it speaks (torch 1.x and 2.x number their queries differently). Exits
0 when all is as expected, 1 with the reason otherwise.
"""
import datetime
import sys

import torch.distributed as dist


def fail(msg):
    print("torch peer: FAIL: " + msg, flush=True)
    sys.exit(1)


T = datetime.timedelta(seconds=120)
if sys.argv[1:] == ["classic"]:  # torch >= 2.2's other server: the classic one, not libuv's
    try:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=T, use_libuv=False)
    except (TypeError, RuntimeError, ValueError):  # torch < 2.2: no use_libuv
        print("skip: torch %s has one TCPStore server only" % __import__("torch").__version__, flush=True)
        sys.exit(0)
else:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=T)
store.set("from_python", b"hello")
print(store.port, flush=True)

store.wait(["from_c"])  # set by tessera
if store.get("from_c") != b"bin\x00ary":
    fail("from_c is %r" % store.get("from_c"))
if store.get("counter") != b"7":  # 3, then 4, added by tessera
    fail("counter is %r" % store.get("counter"))
store.set("py_checked", b"1")

store.wait(["c_done"])  # tessera's process groups have come and gone
for key, want in (("default/joined", b"2"), ("tessera/attempt_0/agent/joined", b"2")):
    try:  # TCPStore.check is torch >= 2.0 only
        store.wait([key], datetime.timedelta(seconds=5))
        got = store.get(key)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError or DistStoreError
        got = "missing (%s)" % e
    if got != want:
        fail("rendezvous key %s is %r, expected %r" % (key, got, want))
print("torch peer: ok (torch %s)" % __import__("torch").__version__, flush=True)
