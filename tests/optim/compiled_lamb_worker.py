"""One gloo rank of tests/optim/test_compiled_lamb.py: LAMB on FSDP2's ``DTensor`` shards, the
compiled update against timm's eager one (two identical sharded models, the same batches)."""

from __future__ import annotations

import timm.optim
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from radio_lit.training.lamb import Lamb
from radio_lit.training.optim import parameter_groups


def model(mesh) -> torch.nn.Module:
    torch.manual_seed(0)
    built = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    fully_shard(built, mesh=mesh)
    return built


def main(rank: int, world_size: int, init_file: str, output: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    mesh = init_device_mesh("cpu", (world_size,))
    models = model(mesh), model(mesh)
    settings = dict(lr=1e-2, weight_decay=0.02, max_grad_norm=1.0)
    optimizers = [
        timm.optim.Lamb(parameter_groups(models[0].named_parameters()), **settings, foreach=True),
        Lamb(parameter_groups(models[1].named_parameters()), **settings, compiled=True),
    ]
    start = [p.to_local().clone() for p in models[0].parameters()]
    generator = torch.Generator().manual_seed(rank)
    frames = counters["frames"]["total"]
    for _ in range(3):
        batch = torch.randn(4, 8, generator=generator)
        for built, optimizer in zip(models, optimizers, strict=True):
            (10 * built(batch).square().mean()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    pairs = list(zip(models[0].parameters(), models[1].parameters(), strict=True))
    torch.save(
        {
            "kinds": sorted({type(p).__name__ for p in models[1].parameters()}),
            "compiled_frames": counters["frames"]["total"] - frames,
            "max_difference": max((a - b).abs().max().item() for a, b in pairs),
            "moved": all(
                not torch.equal(p.to_local(), s)
                for p, s in zip(models[0].parameters(), start, strict=True)
            ),
        },
        output,
    )
    dist.destroy_process_group()
