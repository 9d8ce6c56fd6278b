"""One rank of the scale benchmark on PyTorch's Gloo: the same steps and printed line as
`crates/c10d-world/examples/scale_rank.rs` (see its docs), for `cargo xtask bench-scale`.

    c10drun --nnodes H --node-rank h --nproc-per-node M ... scale_rank.py
"""
import time

T_START = time.time_ns()  # before the imports below: "init in process" counts them

import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

import torch
import torch.distributed as dist

T0 = int(os.environ.get("C10D_SCALE_T0_NS", "0")) or time.time_ns()


def ms():
    return (time.time_ns() - T0) / 1e6


def inp(r, n):
    return (torch.arange(n, dtype=torch.int64) + r).remainder(5).to(torch.float32)


def checked(group, ranks, me, n):
    t = inp(me, n)
    dist.all_reduce(t, group=group)
    want = sum(inp(r, n) for r in ranks)
    return int((t != want).sum())


def sockets_now():
    c = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                c += 1
        except OSError:
            pass
    return c


def vm_hwm_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main():
    dist.init_process_group("gloo")
    fig = [0.0] * 9
    fig[0] = ms()
    fig[1] = (time.time_ns() - T_START) / 1e6
    me, n = dist.get_rank(), dist.get_world_size()
    everyone = list(range(n))
    bad = checked(None, everyone, me, 256)
    fig[2] = ms()
    m = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    hosts = int(os.environ.get("C10D_SCALE_HOSTS", n // m))
    m = n // hosts
    host_ranks = [list(range(h * m, (h + 1) * m)) for h in range(hosts)]
    mine = host_ranks[me // m]

    dist.barrier()
    t = time.perf_counter()
    own = None
    for g in host_ranks:
        pg = dist.new_group(g)
        if me in g:
            own = pg
    bad += checked(own, mine, me, 256)
    fig[3] = (time.perf_counter() - t) * 1e3

    dist.barrier()
    t = time.perf_counter()
    try:
        split = dist.split_group(split_ranks=host_ranks)
        bad += checked(split, mine, me, 256)
        fig[4] = (time.perf_counter() - t) * 1e3
    except Exception as e:  # split_group needs a backend that can split (NCCL)
        if me == 0:
            print(f"split_group unavailable on gloo: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
        fig[4] = -1.0

    dist.barrier()
    t = time.perf_counter()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (hosts, m), mesh_dim_names=("host", "local"))
    column = [h * m + me % m for h in range(hosts)]
    bad += checked(mesh.get_group("host"), column, me, 256)
    bad += checked(mesh.get_group("local"), mine, me, 256)
    fig[5] = (time.perf_counter() - t) * 1e3

    dist.barrier()
    iters = int(os.environ.get("C10D_SCALE_ITERS", "5"))
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], sockets_now())
            time.sleep(0.002)

    th = threading.Thread(target=watch)
    th.start()
    for elems in (256, 16 << 10, 256 << 10):
        for _ in range(iters):
            bad += checked(None, everyone, me, elems)
    stop.set()
    th.join()
    fig[6] = max(peak[0], sockets_now())
    fig[7] = sockets_now()
    fig[8] = vm_hwm_mib()
    f = torch.tensor(fig, dtype=torch.float64)
    dist.all_reduce(f, op=dist.ReduceOp.MAX)
    w = torch.tensor([float(bad)], dtype=torch.float64)
    dist.all_reduce(w)
    keys = ["init_ms", "init_in_process_ms", "first_all_reduce_ms", "new_group_ms", "split_group_ms", "mesh_ms",
            "sockets_during_all_reduce", "sockets_after", "vm_hwm_mib"]
    if me == 0:
        kv = " ".join(f"{k}={v:.1f}" for k, v in zip(keys, f.tolist()))
        print(f"scale: ranks={n} hosts={hosts} {kv} wrong={w.item():g}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if w.item() == 0 else 1)


if __name__ == "__main__":
    main()
