"""The trainer's side of c10d-rs's weight sync (``c10d_world::weight_sync`` is the receiving
side): a PyTorch process broadcasts a sequence of named tensors to inference workers.

The protocol: the manifest, ``[(name, shape, str(dtype)), ...]``, with
``broadcast_object_list``, then either one ``broadcast`` per tensor, or, with
``packed_buffer_bytes``, the tensors' bytes concatenated into uint8 buffers, a buffer closing
once its running total exceeds the size (vLLM's packed mode), one broadcast each. The Rust
receiver's ``pack_plan`` is the same rule.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple

import torch
import torch.distributed as dist


def pack_plan(sizes: Sequence[int], packed_buffer_bytes: int) -> list:
    """The packed buffers for tensors of ``sizes`` bytes: for each, the tensor indices it
    carries (a buffer closes once its running total exceeds the size; the last holds the rest)."""
    plan, open_, total = [], [], 0
    for i, n in enumerate(sizes):
        open_.append(i)
        total += n
        if total > packed_buffer_bytes:
            plan.append(open_)
            open_, total = [], 0
    if open_:
        plan.append(open_)
    return plan


def send_weights(
    tensors: Iterable[Tuple[str, torch.Tensor]],
    packed_buffer_bytes: Optional[int] = None,
    src: int = 0,
    group=None,
) -> None:
    """Broadcasts one weight update from rank ``src`` (call it there; the receivers call
    ``World::receive_weights``). ``tensors``: ``(name, tensor)`` pairs, e.g.
    ``model.state_dict().items()``; CPU tensors for CPU backends."""
    items = [(name, t.contiguous()) for name, t in tensors]
    manifest = [(name, list(t.shape), str(t.dtype)) for name, t in items]
    dist.broadcast_object_list([manifest], src=src, group=group)
    if packed_buffer_bytes is None:
        for _, t in items:
            dist.broadcast(t, src=src, group=group)
        return
    flat = [t.view(-1).view(torch.uint8) for _, t in items]
    for idx in pack_plan([f.numel() for f in flat], packed_buffer_bytes):
        dist.broadcast(torch.cat([flat[i] for i in idx]), src=src, group=group)
