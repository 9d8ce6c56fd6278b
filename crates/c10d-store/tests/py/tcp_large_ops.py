"""PyTorch's TCPStore client at the store's limits against a server given as HOST PORT.

Prints one line per result (values summarised by their SHA-256), then OK. The same script run
against PyTorch's server and against ours must print the same lines.

usage: tcp_large_ops.py HOST PORT [CASE...]   (cases: multi, check, limits; default all)
"""
import hashlib
import sys
from datetime import timedelta

import torch.distributed as dist

host, port = sys.argv[1], int(sys.argv[2])
cases = sys.argv[3:] or ["multi", "check", "limits"]
T = timedelta(seconds=120)
MIB = 1 << 20


def store():
    return dist.TCPStore(host, port, is_master=False, timeout=T, wait_for_workers=False)


def digest(vals):
    h = hashlib.sha256()
    for v in vals:
        h.update(len(v).to_bytes(8, "little"))
        h.update(v)
    return h.hexdigest()[:16]


def value(i):
    # 8 MiB, distinct per i.
    block = bytes((j * 7 + i * 13) % 251 for j in range(251 * 16))
    return (block * (8 * MIB // len(block) + 1))[: 8 * MIB]


def outcome(f):
    try:
        r = f()
        return "ok" if r is None else f"ok {r}"
    except Exception as e:  # the server closed the connection
        return "error " + type(e).__name__


if "multi" in cases:
    s = store()
    keys = [f"big{i}" for i in range(9)]
    vals = [value(i) for i in range(9)]
    want = digest(vals)
    s.multi_set(keys, vals)  # a 72 MiB request
    del vals
    got = s.multi_get(keys)  # a 72 MiB reply
    assert digest(got) == want, "multi_get returned other values"
    print("multi_set 9 x 8 MiB, multi_get:", digest(got))
    got = s.multi_get(["big3", "big0", "big3"])
    print("multi_get repeated keys:", digest(got))
    print("get big8:", digest([s.get("big8")]))
    del got

if "check" in cases:
    s = store()
    # 9,000 keys of 8,000 bytes on the wire ("/" + 7,999 characters): a 72 MB CHECK.
    keys = [f"{i:08}" + "c" * 7991 for i in range(9000)]
    print("check 9000 long keys, none set:", s.check(keys))
    s.multi_set(keys[:10], [b"1"] * 10)
    print("check 9000 long keys, 10 set:", s.check(keys))
    print("check 10 long keys, set:", s.check(keys[:10]))

if "limits" in cases:
    # Each refused request breaks its connection: a fresh client per case.
    key_ok = "k" * 8191  # 8,192 bytes on the wire
    key_long = "k" * 8192
    print("key of 8192 bytes:", outcome(lambda: (lambda s: (s.set(key_ok, "v"), s.get(key_ok))[1])(store())))
    print("key of 8193 bytes:", outcome(lambda: (lambda s: (s.set(key_long, "v"), s.num_keys())[1])(store())))
    # (A value of 8 MiB is accepted: see "multi". PyTorch's libuv server takes tens of seconds
    # to receive one, so it is not repeated here.)
    big = b"x" * (8 * MIB + 1)
    print("value of 8 MiB + 1:", outcome(lambda: (lambda s: (s.set("v9", big), s.num_keys())[1])(store())))
    many = [f"m{i}" for i in range(131073)]
    print("multi_get of 131073 keys:", outcome(lambda: len(store().multi_get(many))))
    print("server alive:", outcome(lambda: store().check([key_ok])))

print("OK", flush=True)
