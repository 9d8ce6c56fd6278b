#!/usr/bin/env python3
"""PyTorch Gloo baseline for c10d-bench: the same command line, timing method and table.

usage:
  python torch_gloo_bench.py <op> [--nproc N] [-b MINBYTES] [-e MAXBYTES] [-f FACTOR]
                             [-d DTYPE] [-o REDOP] [-n ITERS] [-w WARMUP] [-c 0|1]
  op: all_reduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all | sendrecv

With --nproc N it spawns N ranks (torch.multiprocessing, env:// rendezvous on 127.0.0.1);
without it, it is one rank of a job launched by c10drun or torchrun. Rank 0 prints an
nccl-tests table: size count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong; time is
the mean of N blocking iterations after a barrier, max over ranks. Inputs and checks match
c10d-bench (small integers, every element checked). Exit status 1 if anything is wrong.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {
    "float": torch.float32, "float32": torch.float32, "f32": torch.float32,
    "double": torch.float64, "float64": torch.float64, "f64": torch.float64,
    "half": torch.float16, "float16": torch.float16, "f16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
    "int32": torch.int32, "int": torch.int32, "int64": torch.int64, "long": torch.int64,
    "bool": torch.bool,
}
SHORT = {torch.float32: "float", torch.float64: "double", torch.float16: "half",
         torch.bfloat16: "bfloat16", torch.int8: "int8", torch.uint8: "uint8",
         torch.int16: "int16", torch.int32: "int32", torch.int64: "int64", torch.bool: "bool"}
REDOPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "product": dist.ReduceOp.PRODUCT,
          "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG,
          "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
DIVISIBLE = ("all_gather", "reduce_scatter", "all_to_all")


def parse_size(s):
    t = s.strip().upper()
    if t.endswith("B"):
        t = t[:-1]
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    return int(t) * mult


def bus_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in DIVISIBLE:
        return (n - 1) / n
    return 1.0


def values(redop, dtype, r, idx):
    """Input of rank r at the element indices idx (int64 tensor), as float64."""
    if dtype == torch.bool:
        return ((r + idx) % 2).double()
    if redop == "prod":
        return (1 + (r + idx) % 2).double()
    return (1 + (r * 7 + idx) % 5).double()


def expected_reduce(redop, dtype, n, idx):
    vs = torch.stack([values(redop, dtype, k, idx) for k in range(n)])
    if redop == "sum":
        e = vs.sum(0)
    elif redop == "avg":
        e = vs.sum(0) / n
        if not dtype.is_floating_point:
            e = e.trunc()
    elif redop == "prod":
        e = vs.prod(0)
    elif redop == "min":
        e = vs.min(0).values
    elif redop == "max":
        e = vs.max(0).values
    else:
        iv = vs.long()
        e = iv[0]
        for k in range(1, n):
            e = {"band": e & iv[k], "bor": e | iv[k], "bxor": e ^ iv[k]}[redop]
        e = e.double()
    return e


def count_wrong(t, expected):
    got = t.double()
    want = expected.to(t.dtype).double()
    tol = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 1e-2}.get(t.dtype, 0.0)
    ok = (got - want).abs() <= tol * want.abs().clamp(min=1.0)
    return int((~ok).sum())


class Case:
    def __init__(self, a, rank, n, nbytes):
        self.a, self.rank, self.n = a, rank, n
        es = torch.empty((), dtype=a.dtype).element_size()
        count = max(nbytes // es, 1)
        if a.op in DIVISIBLE:
            count = max(count // n, 1) * n
        self.count = count
        in_len, out_len = {"all_reduce": (count, 0), "broadcast": (count, 0), "reduce": (count, 0),
                           "all_gather": (count // n, count), "reduce_scatter": (count, count // n),
                           "all_to_all": (count, count), "sendrecv": (count, count)}[a.op]
        self.inp = torch.zeros(in_len, dtype=a.dtype)
        self.out = torch.zeros(out_len, dtype=a.dtype)
        self.op = REDOPS[a.redop]

    def run(self):
        a, r, n = self.a, self.rank, self.n
        if a.op == "all_reduce":
            dist.all_reduce(self.inp, self.op)
        elif a.op == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp)
        elif a.op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp, self.op)
        elif a.op == "broadcast":
            dist.broadcast(self.inp, 0)
        elif a.op == "reduce":
            dist.reduce(self.inp, 0, self.op)
        elif a.op == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        elif a.op == "sendrecv":
            if n == 1:
                self.out.copy_(self.inp)
                return
            s = dist.isend(self.inp, (r + 1) % n)
            rv = dist.irecv(self.out, (r + n - 1) % n)
            rv.wait()
            s.wait()

    def prepare(self):
        a, r = self.a, self.rank
        idx = torch.arange(self.inp.numel(), dtype=torch.int64)
        if a.op == "all_gather":
            v = values(a.redop, a.dtype, r, r * self.inp.numel() + idx)
        elif a.op == "broadcast" and r != 0:
            v = values(a.redop, a.dtype, r + 3, idx)
        else:
            v = values(a.redop, a.dtype, r, idx)
        self.inp.copy_(v.to(a.dtype))
        self.out.zero_()

    def wrong(self):
        a, r, n = self.a, self.rank, self.n
        if a.op == "all_reduce" or (a.op == "reduce" and r == 0):
            return count_wrong(self.inp, expected_reduce(a.redop, a.dtype, n, torch.arange(self.count)))
        if a.op == "reduce":
            return 0
        if a.op == "broadcast":
            return count_wrong(self.inp, values(a.redop, a.dtype, 0, torch.arange(self.count)))
        if a.op == "all_gather":
            c = self.inp.numel()
            i = torch.arange(self.count)
            return count_wrong(self.out, _per_rank_values(a, i // c, i, n))
        if a.op == "reduce_scatter":
            c = self.out.numel()
            return count_wrong(self.out, expected_reduce(a.redop, a.dtype, n, r * c + torch.arange(c)))
        if a.op == "all_to_all":
            c = self.count // n
            i = torch.arange(self.count)
            src = i // c
            return count_wrong(self.out, _per_rank_values(a, src, r * c + i % c, n))
        if a.op == "sendrecv":
            return count_wrong(self.out, values(a.redop, a.dtype, (r + n - 1) % n, torch.arange(self.count)))
        raise ValueError(a.op)


def _per_rank_values(a, ranks, idx, n):
    out = torch.empty(idx.numel(), dtype=torch.float64)
    for k in range(n):
        m = ranks == k
        out[m] = values(a.redop, a.dtype, k, idx[m])
    return out


def rank_main(a):
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    redop = a.redop if a.op in REDUCING else "none"
    if rank == 0:
        print(f"# torch {torch.__version__} gloo {a.op}: nranks {n}, dtype {SHORT[a.dtype]}, redop {redop}, "
              f"warmup {a.warmup}, iters {a.iters if a.iters else 'auto'}, check {a.check}")
        print(f"# time: mean per iteration, max over ranks; algbw = size/time; busbw = algbw x {bus_factor(a.op, n):.4f}")
        print("#")
        print(f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'time(us)':>11} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>8}", flush=True)
    total_wrong, bus_sum, rows = 0, 0.0, 0
    nbytes = max(a.minbytes, 1)
    while True:
        case = Case(a, rank, n, nbytes)
        size = case.count * case.inp.element_size()
        iters = a.iters or (200 if size <= 64 << 10 else (10 if size >= 16 << 20 else 20))
        case.prepare()
        for _ in range(a.warmup):
            case.run()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            case.run()
        mine = (time.perf_counter() - t0) / iters
        t = torch.tensor([mine], dtype=torch.float64)
        dist.all_reduce(t, dist.ReduceOp.MAX)
        secs = float(t[0])
        wrong = 0
        if a.check:
            case.prepare()
            dist.barrier()
            case.run()
            w = torch.tensor([case.wrong()], dtype=torch.int64)
            dist.all_reduce(w)
            wrong = int(w[0])
        total_wrong += wrong
        algbw = size / secs / 1e9
        busbw = algbw * bus_factor(a.op, n)
        bus_sum += busbw
        rows += 1
        if rank == 0:
            print(f"  {size:>10} {case.count:>12} {SHORT[a.dtype]:>8} {redop:>6} {secs * 1e6:>11.2f} {algbw:>11.3f} {busbw:>11.3f} "
                  f"{wrong if a.check else 'N/A':>8}", flush=True)
        nbytes *= a.factor
        if nbytes > a.maxbytes:
            break
    if rank == 0:
        print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {bus_sum / max(rows, 1):.3f}", flush=True)
    dist.destroy_process_group()
    return 0 if total_wrong == 0 else 1


def _spawned(rank, n, port, a):
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    code = rank_main(a)
    if code:
        sys.exit(code)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", choices=["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "sendrecv"])
    p.add_argument("--nproc", type=int)
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1K"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", dest="factor", type=int, default=2)
    p.add_argument("-d", "--datatype", dest="dtype", default="float")
    p.add_argument("-o", "--op", dest="redop", default="sum")
    p.add_argument("-n", "--iters", type=int, default=0)
    p.add_argument("-w", "--warmup_iters", dest="warmup", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1, choices=[0, 1])
    a = p.parse_args()
    a.dtype = DTYPES[a.dtype.lower()]
    a.redop = "prod" if a.redop.lower() == "product" else a.redop.lower()
    if a.nproc is None:
        if "RANK" not in os.environ:
            sys.exit("torch_gloo_bench: RANK/WORLD_SIZE not set: run under c10drun/torchrun or pass --nproc N")
        sys.exit(rank_main(a))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_spawned, args=(a.nproc, port, a), nprocs=a.nproc, join=True, start_method="spawn")


if __name__ == "__main__":
    main()
