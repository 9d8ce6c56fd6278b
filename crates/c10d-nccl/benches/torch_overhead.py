"""PyTorch's baseline for `cargo bench -p c10d-nccl --bench overhead`: one rank of
`dist.all_reduce` on `"nccl"` (what PyTorch 2.15 builds for it), started by the bench with
torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus C10D_BENCH_DEVICE.

Rendezvous through the bench's TCP store (a c10d-rs store; it speaks PyTorch's protocol) under
the prefix "torch/". For each size (bytes, argv[2:]) rank 0 prints
`torch <bytes> <host_us> <e2e_us>`: host time per call (enqueue and stream wait, no host sync),
and time per op with a device synchronize after each.
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def per_op(fn, iters, sync_each):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
        if sync_each:
            torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / iters * 1e6


def main():
    iters = int(sys.argv[1])
    sizes = [int(s) for s in sys.argv[2:]]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["C10D_BENCH_DEVICE"]))
    torch.cuda.set_device(dev)
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
        timeout=timedelta(seconds=120),
    )
    dist.init_process_group(
        "nccl", store=dist.PrefixStore("torch/", store), rank=rank, world_size=world, device_id=dev
    )
    if rank == 0:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        print(f"torch-version {torch.__version__} nccl {nccl}", flush=True)
    for nbytes in sizes:
        # As the Rust side: fewer iterations for large sizes (256 MiB of traffic, at least 10).
        n = max(10, min(max(iters, 10), (256 << 20) // nbytes))
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        host = per_op(lambda: dist.all_reduce(t), n, False)
        e2e = per_op(lambda: dist.all_reduce(t), n, True)
        if rank == 0:
            print(f"torch {nbytes} {host:.3f} {e2e:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
