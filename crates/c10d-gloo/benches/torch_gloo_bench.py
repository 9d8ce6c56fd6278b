"""PyTorch Gloo baseline with the same methodology as `c10d-gloo-worker bench`.

usage: python torch_gloo_bench.py --nproc N [--op all_reduce] [--min-bytes 1024] [--max-bytes 67108864] [--iters 20]
Prints an nccl-tests style table from rank 0 (time per op in µs, algbw/busbw in GB/s).
"""
import argparse, os, sys, tempfile, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def bus_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def run_op(op, t, out, n):
    if op == "all_reduce":
        dist.all_reduce(t)
    elif op == "broadcast":
        dist.broadcast(t, 0)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, t)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out[: t.numel() // n], t)
    elif op == "all_to_all":
        dist.all_to_all_single(out[: t.numel()], t)


def worker(rank, n, path, a):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=n)
    if rank == 0:
        print(f"# torch {torch.__version__} gloo {a.op}, {n} ranks, float32, 127.0.0.1")
        print(f"{'size(B)':>12} {'count':>12} {'type':>6} {'time(us)':>12} {'algbw':>10} {'busbw':>10} {'#wrong':>8}")
    b = a.min_bytes
    while b <= a.max_bytes:
        count = max(b // 4, n) // n * n
        t = torch.full((count,), float(rank + 1))
        out = torch.zeros(count * n)
        its = a.iters * 20 if b <= 64 << 10 else (max(5, (a.iters + 1) // 2) if b >= 16 << 20 else a.iters)
        for _ in range(5):
            run_op(a.op, t, out, n)
        dist.barrier()
        s = time.perf_counter()
        for _ in range(its):
            run_op(a.op, t, out, n)
        us = (time.perf_counter() - s) * 1e6 / its
        t = torch.full((count,), float(rank + 1))
        run_op(a.op, t, out, n)
        wrong = int((t != n * (n + 1) / 2).sum()) if a.op == "all_reduce" else 0
        total = count * 4 * (n if a.op == "all_gather" else 1)  # nccl-tests: gathered size
        algbw = total / us / 1e3
        if rank == 0:
            print(f"{total:>12} {total // 4:>12} {'float':>6} {us:>12.1f} {algbw:>10.3f} {algbw*bus_factor(a.op, n):>10.3f} {wrong:>8}", flush=True)
        b *= 4
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--op", default="all_reduce")
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    d = tempfile.mkdtemp()
    mp.start_processes(worker, args=(a.nproc, os.path.join(d, "store"), a), nprocs=a.nproc, start_method="spawn")
