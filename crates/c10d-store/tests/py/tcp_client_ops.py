"""PyTorch's TCPStore client drives every op against a server given as HOST PORT (ours).

Prints OK on success; any assertion failure exits non-zero with a traceback.
"""
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist

host, port = sys.argv[1], int(sys.argv[2])
T = timedelta(seconds=30)

s = dist.TCPStore(host, port, world_size=1, is_master=False, timeout=T, wait_for_workers=True)
assert s.num_keys() == 1, s.num_keys()  # init/
for d in (1, 2, 3):
    s.add("key", d)
s.set("key0", "value0")
s.add("key3", 1)
s.set("key1", "value1")
s.add("key3", 2)
s.set("key2", "value2")
for d in range(3, 7):
    s.add("key3", d)
assert s.get("key") == b"6"
assert s.get("key3") == b"21"
for i in range(3):
    assert s.get(f"key{i}") == f"value{i}".encode()
assert s.num_keys() == 6, s.num_keys()
assert s.check(["key3"]) and not s.check(["Randomkey3"])
s.set("-key3", "7")
assert s.get("-key3") == b"7"
assert s.delete_key("-key3")
assert not s.delete_key("-key3")
assert s.num_keys() == 6

# compare_set decision table.
assert s.compare_set("cs", "x", "y") == b"x"
assert not s.check(["cs"])
assert s.compare_set("cs", "", "v") == b"v"
assert s.compare_set("cs", "nope", "w") == b"v"
assert s.compare_set("cs", "v", "w") == b"w"

# wait timeout text and reuse.
t0 = time.time()
try:
    s.wait(["bad_key"], timedelta(milliseconds=250))
    raise AssertionError("wait did not time out")
except dist.DistStoreError as e:
    assert "wait timeout after 250ms, keys: /bad_key" in str(e), str(e)
assert time.time() - t0 >= 0.2
s.wait(["key"], timedelta(seconds=5))

# extended api
s.set("foo", "po")
s.append("foo", "tato")
assert s.get("foo") == b"potato"
s.append("fresh", "x")
assert s.get("fresh") == b"x"
s.multi_set(["m1", "m2"], ["1", "22"])
assert s.multi_get(["m2", "m1"]) == [b"22", b"1"]
assert s.has_extended_api()

# large value (4 MiB, under the 8 MiB cap)
big = bytes(range(256)) * (4 * 4096)
s.set("big", big)
assert s.get("big") == big

# queues
assert s.queue_len("q") == 0
s.queue_push("q", "1")
s.queue_push("q", "2")
assert s.check(["q"]) and s.queue_len("q") == 2
assert s.queue_pop("q") == b"1"
assert s.queue_pop("q", block=False) == b"2"
try:
    s.queue_pop("q", block=False)
    raise AssertionError("expected QueueEmptyError")
except dist.QueueEmptyError as e:
    assert "queue is empty" in str(e)

# list_keys drops init/
keys = set(s.list_keys())
assert "key" in keys and "init/" not in keys and not any(k.startswith("/") for k in keys), keys

# clone + wait woken by another connection
c = s.clone()
def later():
    time.sleep(0.2)
    c.set("late", "1")
th = threading.Thread(target=later)
th.start()
s.wait(["late"], timedelta(seconds=20))
th.join()

# native barrier (PyTorch >= 2.12 has Store.barrier)
if hasattr(s, "barrier"):
    s.barrier("bar1", 1, timedelta(seconds=5))

# delete/num_keys sequence
n = s.num_keys()
s.delete_key("key0")
assert s.num_keys() == n - 1
print("OK", flush=True)
