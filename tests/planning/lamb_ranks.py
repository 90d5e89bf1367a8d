"""One rank of ``test_communication.py``'s LAMB count: a module's parameters sharded by FSDP2
over two gloo ranks, the run's optimizer (timm's ``Lamb`` through
:func:`~radio_lit.training.optim.parameter_groups` and ``fastest_implementation``) at each
setting, and the all-reduces of one step counted: ``[[values of each], ...]`` per setting,
one JSON line from rank 0."""

from __future__ import annotations

import json

import timm.optim
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from radio_lit.training.optim import fastest_implementation, parameter_groups

#: Optimizer settings, each counted on a fresh optimizer.
SETTINGS = [
    {"weight_decay": 0.02},
    {"weight_decay": 0.02, "max_grad_norm": None},
    {"weight_decay": 0.02, "foreach": False},
    {"weight_decay": 0.0},
    {"weight_decay": 0.0, "always_adapt": True},
]


def module() -> nn.Module:
    """A student (a block, a norm) and a head, named as a DistillationModule names them."""
    root = nn.Module()
    root.student = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    root.heads = nn.ModuleDict({"t": nn.Linear(4, 6)})
    return root


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    root = module()
    fully_shard(root.heads["t"], mesh=mesh)
    fully_shard(root.student, mesh=mesh)
    counted: list[int] = []
    for name in ("all_reduce", "all_reduce_coalesced"):  # DTensor's reductions
        if hasattr(funcol, name):
            original = getattr(funcol, name)

            def counting(tensor, *args, _original=original, **kwargs):
                tensors = tensor if isinstance(tensor, list) else [tensor]
                counted.extend(t.numel() for t in tensors)
                return _original(tensor, *args, **kwargs)

            setattr(funcol, name, counting)
    reduce = dist.all_reduce

    def counting_c10d(tensor, *args, **kwargs):
        counted.append(tensor.numel())
        return reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_c10d
    rows = []
    for settings in SETTINGS:
        named = list(root.named_parameters())
        optimizer = fastest_implementation(timm.optim.Lamb(parameter_groups(named), **settings))
        for _ in range(2):  # the second step: state made, as a run's steady state
            root.heads["t"](root.student(torch.randn(4, 8))).square().sum().backward()
            counted.clear()
            optimizer.step()
            optimizer.zero_grad()
        rows.append(list(counted))
    if dist.get_rank() == 0:
        print(json.dumps(rows), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
