"""c10drs against PyTorch's Gloo, both through torch.distributed (Python overhead included).

    python torch_backends.py [--nprocs 2 4] [--rounds 3]

For each world size, the two backends run alternately, `--rounds` times each; every figure is
the best round. Within a round, an op is timed over a loop of blocking calls after a warm-up,
and the slowest rank's mean time per call counts. Bus bandwidth uses nccl-tests' factors:
all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

KIB, MIB = 1 << 10, 1 << 20
# (op, bytes per rank's input, timed iterations)
CASES = [
    ("all_reduce", 1 * KIB, 400),
    ("all_reduce", 1 * MIB, 40),
    ("all_reduce", 16 * MIB, 10),
    ("all_gather_into_tensor", 1 * MIB, 40),
    ("all_gather_into_tensor", 16 * MIB, 8),
    ("reduce_scatter_tensor", 1 * MIB, 40),
    ("reduce_scatter_tensor", 16 * MIB, 8),
    ("broadcast", 1 * MIB, 40),
    ("broadcast", 16 * MIB, 10),
]


def busbw_factor(op: str, n: int) -> float:
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(op, (n - 1) / n)


def bus_bytes(op: str, nbytes: int, n: int) -> float:
    # all_gather / reduce_scatter: nccl-tests counts the whole (n x) buffer
    total = nbytes * n if op in ("all_gather_into_tensor", "reduce_scatter_tensor") else nbytes
    return total * busbw_factor(op, n)


def runner(op: str, nbytes: int, n: int, rank: int):
    count = nbytes // 4
    if op == "all_reduce":
        t = torch.ones(count)
        return lambda: dist.all_reduce(t)
    if op == "broadcast":
        t = torch.ones(count)
        return lambda: dist.broadcast(t, 0)
    if op == "all_gather_into_tensor":
        t, out = torch.ones(count), torch.empty(count * n)
        return lambda: dist.all_gather_into_tensor(out, t)
    t, out = torch.ones(count * n), torch.empty(count)
    return lambda: dist.reduce_scatter_tensor(out, t)


def rank_main(rank: int, n: int, backend: str, port: int, out: str) -> None:
    if backend == "c10drs":
        import c10d_rs  # noqa: F401
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=n)
    rows = []
    for op, nbytes, iters in CASES:
        fn = runner(op, nbytes, n, rank)
        for _ in range(max(3, iters // 5)):
            fn()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        per_call = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
        rows.append((op, nbytes, per_call.item()))
    if rank == 0:
        torch.save(rows, out)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def one_round(backend: str, n: int) -> list:
    store = dist.TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.pt")
        mp.start_processes(rank_main, args=(n, backend, store.port, out), nprocs=n,
                           start_method="spawn")
        return torch.load(out)


def human(nbytes: int) -> str:
    return f"{nbytes // MIB} MiB" if nbytes >= MIB else f"{nbytes // KIB} KiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"torch {torch.__version__}; best of {args.rounds} alternating rounds; float32")
    print(f"{'ranks':>5} {'op':<24} {'size':>7} {'c10drs µs':>10} {'gloo µs':>10} "
          f"{'c10drs GB/s':>11} {'gloo GB/s':>10} {'time ratio':>10}")
    for n in args.nprocs:
        best = {"c10drs": {}, "gloo": {}}
        for _ in range(args.rounds):
            for backend in ("c10drs", "gloo"):
                for op, nbytes, t in one_round(backend, n):
                    key = (op, nbytes)
                    best[backend][key] = min(t, best[backend].get(key, float("inf")))
        for op, nbytes, _ in CASES:
            ours, theirs = best["c10drs"][(op, nbytes)], best["gloo"][(op, nbytes)]
            bb = bus_bytes(op, nbytes, n)
            print(f"{n:>5} {op:<24} {human(nbytes):>7} {ours * 1e6:>10.1f} {theirs * 1e6:>10.1f} "
                  f"{bb / ours / 1e9:>11.2f} {bb / theirs / 1e9:>10.2f} {ours / theirs:>9.2f}x")


if __name__ == "__main__":
    main()
