"""PyTorch's side of benches/device_mesh.rs: one rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT from
the bench, which hosts the store) times init_device_mesh("cpu", shape) on gloo, REPS meshes per
shape after a barrier each, and prints the median milliseconds per shape on a TIMES line."""
import os, statistics, time, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

SHAPES = [(4,), (2, 2)]
REPS = int(os.environ.get("REPS", "5"))

dist.init_process_group("gloo")
figs = []
for shape in SHAPES:
    names = tuple(f"d{d}" for d in range(len(shape)))
    times = []
    for _ in range(REPS):
        dist.barrier()
        t = time.perf_counter()
        m = init_device_mesh("cpu", shape, mesh_dim_names=names)
        times.append((time.perf_counter() - t) * 1e3)
        del m
    figs.append(f"{statistics.median_low(times):.3f}")
print("TIMES " + " ".join(figs), flush=True)
dist.barrier()
dist.destroy_process_group()
