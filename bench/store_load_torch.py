"""bench/store_load_torch.py — PyTorch's TCPStore server for bench/store_load.sh.

    python3 bench/store_load_torch.py PORT_FILE

Starts torch.distributed.TCPStore as the master on 127.0.0.1 (a free port; the libuv server where this
torch has one, as torchrun's), writes the port and torch's version to PORT_FILE, and serves until its
stdin closes. bench_store_load --target torch drives it with the same C clients as Tessera's store.
"""
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist


def main():
    out = sys.argv[1]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    kw = dict(is_master=True, timeout=datetime.timedelta(seconds=600), wait_for_workers=False)
    try:
        store = dist.TCPStore("127.0.0.1", port, None, **kw, use_libuv=True)
        server = "libuv"
    except TypeError:
        store = dist.TCPStore("127.0.0.1", port, None, **kw)
        server = "classic"
    with open(out + ".tmp", "w") as f:
        f.write(f"{port} {torch.__version__} {server}\n")
    os.rename(out + ".tmp", out)
    while sys.stdin.read(4096):
        pass
    del store


if __name__ == "__main__":
    main()
