"""PyTorch's ProcessGroupNCCL baseline for `cargo bench -p c10d-nccl --bench overhead`.

World size 1 on cuda:0; for each size (bytes, argv) prints one line
`torch <bytes> <host_us> <e2e_us>`: host time per `dist.all_reduce` call (enqueue and stream
wait, no host sync), and time per op with a device synchronize after each.
"""
import sys
import time

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
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev)
    print(f"torch-version {torch.__version__} nccl {'.'.join(map(str, torch.cuda.nccl.version()))}", flush=True)
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        host = per_op(lambda: dist.all_reduce(t), iters, False)
        e2e = per_op(lambda: dist.all_reduce(t), iters, True)
        print(f"torch {nbytes} {host:.3f} {e2e:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
