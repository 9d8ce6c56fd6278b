"""Weight sync across languages: a PyTorch trainer on "c10drs" (rank 0) broadcasts a small
model's state_dict to two Rust receivers on "gloo" (the example ``weight_sync_receiver``), one
tensor at a time and packed; the Rust side ends with bit-identical tensors. The manifest goes
through ``broadcast_object_list`` (pickled on both sides)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from harness import run_mixed

RECEIVER = os.environ.get("C10D_WEIGHT_SYNC_RECEIVER")
WORLD = 3


def _state_dict():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(33, 64), nn.ReLU(), nn.Linear(64, 8))
    model[2].to(torch.bfloat16)
    sd = dict(model.state_dict())
    sd["step"] = torch.tensor([42], dtype=torch.int64)
    return sd


def _trainer(port: int, packed, out: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from c10d_rs.weight_sync import send_weights  # also registers "c10drs"

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("c10drs", store=store, rank=0, world_size=WORLD)
    sd = _state_dict()
    send_weights(sd.items(), packed_buffer_bytes=packed)
    for k, t in sd.items():
        Path(out, f"{k}.bin").write_bytes(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.skipif(RECEIVER is None, reason="C10D_WEIGHT_SYNC_RECEIVER not set (cargo xtask python sets it)")
@pytest.mark.parametrize("packed", [None, 4096])
def test_pytorch_trainer_to_rust_receivers(packed):
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [os.path.join(tmp, f"rank{r}") for r in range(WORLD)]
        for d in dirs:
            os.makedirs(d)
        env = {"WORLD_SIZE": str(WORLD)}
        if packed is not None:
            env["C10D_PACKED"] = str(packed)
        envs = [dict(env, RANK=str(r), C10D_OUT=dirs[r]) for r in (1, 2)]
        for code, out, err in run_mixed(RECEIVER, envs, _trainer, (packed, dirs[0])):
            assert code == 0, f"receiver failed ({code}): {out}\n{err}"
            assert "received 5 tensors" in out, out
        names = sorted(os.listdir(dirs[0]))
        assert len(names) == 5
        for d in dirs[1:]:
            assert sorted(os.listdir(d)) == names
            for n in names:
                assert Path(d, n).read_bytes() == Path(dirs[0], n).read_bytes(), n
