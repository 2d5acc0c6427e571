#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Store servers for tests/torchrun/test_store.c.

    store_server.py torch              a real torch.distributed.TCPStore (the master)
    store_server.py validate-classic   fakes of the later (VALIDATE) dialect, written
    store_server.py validate-libuv     from torch's TCPStore sources: the classic server
                                       drops a client whose first query is not VALIDATE,
                                       the libuv one ignores it

Prints "PORT <n>" once listening, then obeys lines on stdin, each answered
by one line on stdout, with keys as torch's TCPStore client names them:
    set KEY VALUE | get KEY | add KEY N | check KEY | later SECONDS KEY VALUE
("later" sets the key from another thread after a while; answers "ok" at
once).  End of stdin ends it.
"""
import socket
import struct
import sys
import threading
import time

MAGIC = 0x3C85F7CE
# The later dialect's query types (TCPStoreBackend.hpp).
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS = range(8)


class Fake:
    """A TCPStore server of the VALIDATE dialect (keys carry torch's "/")."""

    def __init__(self, libuv):
        self.libuv = libuv
        self.data = {}
        self.cond = threading.Condition()
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    # the Python side, as TCPStore's client sees it
    def set(self, k, v):
        with self.cond:
            self.data["/" + k] = v
            self.cond.notify_all()

    def get(self, k):
        with self.cond:
            self.cond.wait_for(lambda: "/" + k in self.data, timeout=30)
            return self.data["/" + k]

    def add(self, k, n):
        with self.cond:
            v = int(self.data.get("/" + k, b"0")) + n
            self.data["/" + k] = str(v).encode()
            self.cond.notify_all()
            return v

    def check(self, keys):
        with self.cond:
            return all("/" + k in self.data for k in keys)

    def accept(self):
        while True:
            c, _ = self.ls.accept()
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        def recv(n):
            b = b""
            while len(b) < n:
                k = c.recv(n - len(b))
                if not k:
                    raise EOFError
                b += k
            return b

        def u64():
            return struct.unpack("<Q", recv(8))[0]

        def string():
            n = u64()
            if n > 1 << 20:
                raise ValueError("string too long")
            return recv(n)

        try:
            q = recv(1)[0]
            if q != VALIDATE:
                if self.libuv:  # ignored, the connection kept
                    while c.recv(4096):
                        pass
                return  # the classic server drops it
            if struct.unpack("<I", recv(4))[0] != MAGIC:
                return
            while True:
                q = recv(1)[0]
                if q == SET:
                    k = string().decode()
                    v = string()
                    with self.cond:
                        self.data[k] = v
                        self.cond.notify_all()
                elif q == GET:
                    k = string().decode()
                    with self.cond:
                        v = self.data[k]
                    c.sendall(struct.pack("<Q", len(v)) + v)
                elif q == ADD:
                    k = string().decode()
                    n = struct.unpack("<q", recv(8))[0]
                    with self.cond:
                        v = int(self.data.get(k, b"0")) + n
                        self.data[k] = str(v).encode()
                        self.cond.notify_all()
                    c.sendall(struct.pack("<q", v))
                elif q in (CHECK, WAIT):
                    keys = [string().decode() for _ in range(u64())]
                    with self.cond:
                        if q == WAIT:
                            self.cond.wait_for(lambda: all(k in self.data for k in keys))
                        ready = all(k in self.data for k in keys)
                    c.sendall(bytes([0 if ready else 1]))
                elif q == GETNUMKEYS:
                    with self.cond:
                        c.sendall(struct.pack("<q", len(self.data)))
                else:
                    return
        except (EOFError, KeyError, ValueError, OSError):
            pass
        finally:
            c.close()


def main():
    mode = sys.argv[1]
    if mode == "torch":
        from datetime import timedelta

        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), wait_for_workers=False)
        port = store.port
    elif mode in ("validate-classic", "validate-libuv"):
        store = Fake(mode == "validate-libuv")
        port = store.port
    else:
        sys.exit("unknown mode " + mode)
    print("PORT %d" % port, flush=True)
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        if w[0] == "set":
            store.set(w[1], w[2].encode())
            out = "ok"
        elif w[0] == "get":
            out = store.get(w[1]).decode()
        elif w[0] == "add":
            out = str(store.add(w[1], int(w[2])))
        elif w[0] == "check":
            out = str(bool(store.check([w[1]])))
        elif w[0] == "later":
            def later(s=float(w[1]), k=w[2], v=w[3].encode()):
                time.sleep(s)
                store.set(k, v)
            threading.Thread(target=later, daemon=True).start()
            out = "ok"
        else:
            out = "?"
        print(out, flush=True)


if __name__ == "__main__":
    main()
