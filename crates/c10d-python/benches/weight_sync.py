"""Weight-sync throughput on CPU: a PyTorch trainer (rank 0) broadcasts 1 GiB of float32 in
64 MiB tensors to two receivers, one tensor at a time and packed into 1 GiB buffers (vLLM's
packed mode), in one run:

- ``c10drs -> rust``: the trainer on "c10drs", the receivers the Rust example
  ``weight_sync_receiver`` on "gloo" (``c10d_world::weight_sync``);
- ``gloo -> torch``: all three PyTorch processes on PyTorch's own "gloo" (the baseline).

    python weight_sync.py --receiver target/release/examples/weight_sync_receiver [--gib 1] [--rounds 2]

The trainer sends two updates; the receivers take the first into new tensors and the second
into the same tensors (as a server's weights), and the figure is the second's: the slowest
receiver's throughput (GB/s = 10^9 bytes/s of tensor data, from the manifest's arrival to the
last byte), the best of ``--rounds`` rounds. The trainer's packing copies (a 1 GiB
``torch.cat``) are inside the packed figures of both.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from c10d_rs.weight_sync import pack_plan

MIB = 1 << 20
WORLD = 3


def _tensors(gib: float):
    n = int(gib * 1024 // 64)
    return {f"layer{i}.weight": torch.full((64 * MIB // 4,), float(i)) for i in range(n)}


def _init(backend: str, port: int, rank: int) -> None:
    if backend == "c10drs":
        import c10d_rs  # noqa: F401
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group(backend, store=store, rank=rank, world_size=WORLD)


UPDATES = 2


def _trainer(backend, port, gib, packed):
    _init(backend, port, 0)
    from c10d_rs.weight_sync import send_weights

    sd = _tensors(gib)
    for _ in range(UPDATES):
        send_weights(sd.items(), packed_buffer_bytes=packed)
    dist.destroy_process_group()
    os._exit(0)


def _torch_receiver(port, rank, packed, q):
    _init("gloo", port, rank)
    held = None
    for _ in range(UPDATES):
        m = [None]
        dist.broadcast_object_list(m, src=0)
        start = time.perf_counter()
        if held is None:
            held = [torch.empty(shape) for _, shape, _ in m[0]]
        if packed is None:
            for t in held:
                dist.broadcast(t, src=0)
        else:  # the trainer's buffers, cut into the held tensors
            views = [t.view(torch.uint8) for t in held]
            for idx in pack_plan([v.numel() for v in views], packed):
                buf = torch.empty(sum(views[i].numel() for i in idx), dtype=torch.uint8)
                dist.broadcast(buf, src=0)
                for v, part in zip((views[i] for i in idx), buf.split([views[i].numel() for i in idx])):
                    v.copy_(part)
        rate = sum(t.numel() * 4 for t in held) / (time.perf_counter() - start) / 1e9
    q.put(rate)
    dist.destroy_process_group()
    os._exit(0)


def _round(kind, receiver, gib, packed):
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    backend = "c10drs" if kind == "rust" else "gloo"
    trainer = ctx.Process(target=_trainer, args=(backend, store.port, gib, packed))
    trainer.start()
    rates = []
    if kind == "rust":
        env = dict(os.environ, WORLD_SIZE=str(WORLD), C10D_STORE_PORT=str(store.port), C10D_TIMEOUT_S="300",
                   C10D_UPDATES=str(UPDATES))
        if packed is not None:
            env["C10D_PACKED"] = str(packed)
        procs = [subprocess.Popen([receiver], env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True)
                 for r in (1, 2)]
        for p in procs:
            out, _ = p.communicate(timeout=600)
            # last line: "rank R update U: received N tensors, B bytes in S s (X GB/s)"
            rates.append(float(out.strip().splitlines()[-1].rsplit("(", 1)[1].split()[0]))
    else:
        q = ctx.Queue()
        procs = [ctx.Process(target=_torch_receiver, args=(store.port, r, packed, q)) for r in (1, 2)]
        for p in procs:
            p.start()
        rates = [q.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
    trainer.join(timeout=60)
    return min(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--receiver", required=True)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    print(f"weight sync, {a.gib} GiB of float32 in 64 MiB tensors, trainer + 2 receivers, torch {torch.__version__}")
    print(f"{'mode':>9} | {'c10drs->rust GB/s':>17} | {'gloo->torch GB/s':>16} | ratio")
    for packed in (None, 1 << 30):
        best = {}
        for _ in range(a.rounds):
            for kind in ("rust", "torch"):
                r = _round(kind, a.receiver, a.gib, packed)
                best[kind] = max(best.get(kind, 0.0), r)
        mode = "unpacked" if packed is None else "packed"
        print(f"{mode:>9} | {best['rust']:>17.3f} | {best['torch']:>16.3f} | {best['rust'] / best['torch']:.2f}x")


if __name__ == "__main__":
    main()
