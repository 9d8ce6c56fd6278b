"""One rank of a 2-rank gloo job that rendezvous via env:// against the agent store given by
MASTER_ADDR/MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True, like torchrun's agent)."""
import os
from datetime import timedelta

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
t = torch.tensor([float(rank + 1)] * 4)
dist.all_reduce(t)
assert t.tolist() == [3.0] * 4, t
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} OK", flush=True)
