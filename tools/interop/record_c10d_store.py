#!/usr/bin/env python3
"""Records exchanges between PyTorch's own TCPStore client and server (through
a recording proxy) as fixtures for //tests/comm:c10d_store_test, which replays
them against shardkit's C10dStore with a fake server (no PyTorch needed there).

    /work/venv/bin/python tools/interop/record_c10d_store.py tests/comm/testdata/c10d_store

Fixture format: '#' comments; 'conn N' starts connection N's script (in the
order the client opens them); '> HEX' bytes the client sends, '< HEX' bytes the
server answers, '< EOF' the server closes the connection. '??' in a '>' line is
a byte that may differ (the PING nonce); '??' in a '<' line echoes those bytes.
"""
import os
import socket
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

MAGIC_AND_PING = bytes.fromhex("00cef7853c0d")


def record(use_libuv):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10), use_libuv=use_libuv)
    log = []  # (conn, direction, bytes)
    lock = threading.Lock()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def pump(src, dst, direction, conn):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                with lock:
                    if direction == "<":
                        log.append((conn, "<", None))
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            with lock:
                log.append((conn, direction, data))
            dst.sendall(data)

    def accept():
        conn = 0
        while True:
            c, _ = listener.accept()
            s = socket.create_connection(("127.0.0.1", server.port))
            threading.Thread(target=pump, args=(c, s, ">", conn), daemon=True).start()
            threading.Thread(target=pump, args=(s, c, "<", conn), daemon=True).start()
            conn += 1

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]

    def client():
        c = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=5), use_libuv=use_libuv)
        time.sleep(0.2)
        return c

    # conn 0: every operation C10dStore uses.
    c0 = client()
    c0.set("k", b"v1")
    assert c0.get("k") == b"v1"
    assert c0.add("ctr", 5) == 5
    assert c0.add("ctr", -2) == 3
    assert c0.get("ctr") == b"3"
    assert c0.compare_set("k", b"v1", b"v2") == b"v2"
    assert c0.compare_set("k", b"zz", b"v3") == b"v2"
    assert c0.compare_set("new", b"", b"n1") == b"n1"
    assert c0.check(["k", "missing"]) is False
    assert c0.check(["k"]) is True
    try:
        c0.wait(["missing"], timedelta(milliseconds=300))
        raise AssertionError("wait for a missing key returned")
    except dist.DistStoreError:
        pass
    c0.set("bin", b"\x00\x01\xff")
    assert c0.get("bin") == b"\x00\x01\xff"
    c0.set("empty", b"")
    assert c0.get("empty") == b""
    time.sleep(0.3)
    # conn 1 waits for a key conn 2 sets later.
    c1 = client()
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("late", c1.get("late")))
    t.start()
    time.sleep(0.5)
    c2 = client()
    c2.set("late", b"here")
    t.join()
    assert got["late"] == b"here"
    time.sleep(0.3)
    # conn 3: an add to a key holding text the server cannot parse.
    c3 = client()
    try:
        c3.add("k", 1)
    except Exception:  # the server drops the connection
        pass
    time.sleep(0.5)
    return log


def write(log, path, title):
    conns = {}
    for conn, direction, data in log:
        lines = conns.setdefault(conn, [])
        if data is None:
            lines.append(["<", None])
        elif lines and lines[-1][0] == direction and lines[-1][1] is not None:
            lines[-1][1] += data
        else:
            lines.append([direction, bytearray(data)])
    with open(path, "w") as f:
        f.write(f"# {title}\n# recorded with torch {torch.__version__} by tools/interop/record_c10d_store.py\n")
        for conn in sorted(conns):
            f.write(f"conn {conn}\n")
            for direction, data in conns[conn]:
                if data is None:
                    f.write("< EOF\n")
                    continue
                hexs = data.hex()
                if direction == ">" and bytes(data[:6]) == MAGIC_AND_PING:
                    hexs = MAGIC_AND_PING.hex() + "??" * 4 + data[10:].hex()
                elif direction == "<" and conns[conn][0][1][:6] == MAGIC_AND_PING and len(data) >= 4 \
                        and f.tell() and data is conns[conn][1][1]:
                    hexs = "??" * 4 + data[4:].hex()
                f.write(f"{direction} {hexs}\n")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for use_libuv, name in ((True, "libuv"), (False, "classic")):
        log = record(use_libuv)
        write(log, os.path.join(out, f"torch_{name}_server.txt"),
              f"PyTorch's TCPStore client and its {name} server (use_libuv={use_libuv})")


if __name__ == "__main__":
    main()
