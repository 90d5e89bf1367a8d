"""Two CPU/gloo ranks shard a tiny CPE ViT and a tiny E-RADIO student with FSDP2 and write
what the tests check.

Usage::

    PYTHONPATH=<repo root> python tests/students/fsdp2_student.py OUTPUT_DIR

The student (σReparam on, ViTDet windows of 2 patches) is sharded by
:func:`radio_lit.students.shard_student`, as ``DistillationModule.configure_model`` does, under
a bf16 parameter policy (``MixedPrecisionPolicy(param_dtype=bfloat16)``); it runs one training
step and one eval forward. Each rank writes ``rank{R}.pt`` with local shard shapes, state-dict
keys, and the position embeddings the sharded student sampled next to those an unsharded
float32 copy samples with the same RNG state.

The E-RADIO student is sharded the same way (its transformer layers, then the root:
convolutional stages, BatchNorm, up/downsampling, summary pooling), float32. Rank ``r`` runs a
training step on its half of a batch, then an eval forward on the whole batch; unsharded copies
run the same step on each half (gradients averaged, as FSDP2 reduces them). BatchNorm buffers
are neither sharded nor synchronized: each rank's running statistics are those of its own
batches. Each rank writes ``eradio_rank{R}.pt`` with its outputs, the gathered gradients, local
shard shapes, and the reference values.

Tiny CPE ViTs are also sharded under each :class:`radio_lit.students.sharding.FSDP2` setting
(layout, resharding, prefetching, reduce dtype): each rank writes ``settings_rank{R}.pt`` with
what FSDP2 holds for each (units, weights gathered after a training forward, prefetch lists,
the reduce dtype), and, per σReparam version and layout, a training step of the same batch on
both ranks inside ``spectral_step`` (features, gathered gradients, refined ``u``) next to an
unsharded copy's.
"""

from __future__ import annotations

import copy
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
GRID = (4, 4)  # 64 px images, patch 16


def run_rank(rank: int, port: int, output: str) -> None:
    """Rank ``rank`` of the run (the process group through ``127.0.0.1:port``)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=60))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from radio_lit.students import SpectralLinear, shard_student
    from tests.builders import tiny_student

    torch.manual_seed(0)
    student = tiny_student(num_cls_tokens=2, vitdet_window_sizes=[2])
    with torch.no_grad():  # values a bf16 parameter holds exactly
        student.pos_embed.copy_(student.pos_embed.bfloat16().float())
    reference = copy.deepcopy(student)  # unsharded, float32

    mesh = init_device_mesh("cpu", (WORLD_SIZE,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    shard_student(student, mesh, policy)

    sampled: dict[bool, torch.Tensor] = {}
    sample = student.position_embeddings

    def recording(batch: int, hw: tuple[int, int]) -> torch.Tensor:
        out = sample(batch, hw)
        sampled[student.training] = out.detach().clone()
        return out

    student.position_embeddings = recording
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(rank))

    torch.manual_seed(1)
    out = student.train()(images)
    out.features.float().square().mean().backward()
    torch.manual_seed(1)
    expected_train = reference.train().position_embeddings(2, GRID)
    with torch.no_grad():
        student.eval()(images)
    expected_eval = reference.eval().position_embeddings(1, GRID)
    student.reshard()  # the root keeps its parameters gathered after a no-grad forward

    scales = [m.spectral_scale for m in student.modules() if isinstance(m, SpectralLinear)]
    result = {
        "local_shapes": {n: tuple(p.to_local().shape) for n, p in student.named_parameters()},
        "shapes": {n: tuple(p.shape) for n, p in student.named_parameters()},
        "parameter_classes": sorted({type(p).__name__ for p in student.parameters()}),
        "state_dict_keys": sorted(student.state_dict()),
        "reference_state_dict_keys": sorted(reference.state_dict()),
        "compute_dtype": str(out.features.dtype),
        "sampled": sampled,
        "expected": {True: expected_train, False: expected_eval},
        "scale_gradients": [
            s.grad is not None and bool(s.grad.full_tensor().abs().sum() > 0) for s in scales
        ],
    }
    torch.save(result, Path(output) / f"rank{rank}.pt")
    torch.save(_eradio(rank, mesh), Path(output) / f"eradio_rank{rank}.pt")
    torch.save(_settings(mesh), Path(output) / f"settings_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _eradio_loss(out) -> torch.Tensor:
    return out.features.square().mean() + out.summary.square().mean()


def _eradio(rank: int, mesh) -> dict:
    """The E-RADIO run of one rank (module docstring); returns what ``eradio_rank{R}.pt`` holds."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from radio_lit.students import ERadio, shard_student

    torch.manual_seed(0)
    student = ERadio(width=16, depths=(1, 1, 1, 1), window_size=2, head_dim=16)
    reference = copy.deepcopy(student)
    images = torch.randn(4, 3, 64, 48, generator=torch.Generator().manual_seed(0))
    halves = images.chunk(WORLD_SIZE)

    shard_student(student, mesh, MixedPrecisionPolicy())
    _eradio_loss(student.train()(halves[rank])).backward()
    with torch.no_grad():
        evaluated = student.eval()(images)
    student.reshard()  # the root keeps its parameters gathered after a no-grad forward

    gradients: dict[str, torch.Tensor] = {}
    for index, half in enumerate(halves):  # unsharded copies; FSDP2 averages the gradients
        copied = copy.deepcopy(reference)
        (_eradio_loss(copied.train()(half)) / WORLD_SIZE).backward()
        for name, param in copied.named_parameters():
            gradients[name] = gradients.get(name, 0) + param.grad
        if index == rank:
            own = copied  # BatchNorm running statistics: updated by this rank's half alone
    with torch.no_grad():
        expected = own.eval()(images)
    return {
        "local_shapes": {n: tuple(p.to_local().shape) for n, p in student.named_parameters()},
        "shapes": {n: tuple(p.shape) for n, p in student.named_parameters()},
        "gradients": {n: p.grad.full_tensor() for n, p in student.named_parameters()},
        "expected_gradients": gradients,
        "features": evaluated.features,
        "summary": evaluated.summary,
        "expected_features": expected.features,
        "expected_summary": expected.summary,
        "running_mean": student.stem[0].bn.running_mean,
    }


#: FSDP2 settings of :func:`_settings`, by name.
SETTINGS = {
    "default": {},
    "blocks": dict(layout="blocks"),
    "zero2": dict(layout="blocks", reshard_after_forward=False, prefetch=2),
    "bf16_reduce": dict(reduce_dtype="bfloat16"),
}


def _settings(mesh) -> dict:
    """Per :data:`SETTINGS` entry, a tiny 3-block CPE ViT sharded by ``shard_for_training``
    under a bf16 policy: which modules are FSDP2 units, whether each block's weights are still
    gathered after a training forward, each block's forward/backward prefetch list (block
    indices), the student's reduce dtype."""
    from torch.distributed.fsdp import FSDPModule

    from radio_lit.students.sharding import FSDP2, shard_for_training
    from tests.builders import tiny_student

    found = {}
    for name, options in SETTINGS.items():
        torch.manual_seed(0)
        student = tiny_student(model_kwargs=dict(depth=3, embed_dim=32, num_heads=2))
        shard_for_training(student, [], torch.nn.Module(), mesh, True, FSDP2(**options))
        student.train()(torch.randn(1, 3, 32, 32))
        index = {block: i for i, block in enumerate(student.blocks)}

        def prefetched(block, direction, index=index):
            if not isinstance(block, FSDPModule):
                return None
            states = getattr(block._get_fsdp_state(), f"_states_to_{direction}_prefetch")
            return [index[s._modules[0]] for s in states]

        found[name] = {
            "units": [
                n or "student" for n, m in student.named_modules() if isinstance(m, FSDPModule)
            ],
            "gathered": [not _is_dtensor(b.mlp.fc1.weight) for b in student.blocks],
            "forward_prefetch": [prefetched(b, "forward") for b in student.blocks],
            "backward_prefetch": [prefetched(b, "backward") for b in student.blocks],
            "reduce_dtype": student._get_fsdp_state()._mp_policy.reduce_dtype,
        }
    found["steps"] = {v: _layout_steps(mesh, v) for v in (1, 2)}
    return found


def _layout_steps(mesh, version: int) -> dict:
    """A float32 training step of one batch (the same on both ranks, so FSDP2's averaged
    gradients are the batch's) inside ``spectral_step``, unsharded and under each layout."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from radio_lit.students.sharding import FSDP2, shard_student
    from radio_lit.students.spectral_reparam import spectral_step
    from tests.builders import tiny_student

    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    steps = {}
    for layout in ("none", "student", "blocks"):
        torch.manual_seed(0)
        student = tiny_student(spectral_reparam_version=version).train()
        if layout != "none":
            shard_student(student, mesh, MixedPrecisionPolicy(), FSDP2(layout=layout))
        with spectral_step(student):
            out = student(images)
            (out.features.square().mean() + out.summary.square().mean()).backward()
        qkv = student.blocks[0].attn.qkv
        steps[layout] = {
            "features": out.features.detach(),
            "gradients": {n: _full(p.grad) for n, p in student.named_parameters()},
            "u": _full(qkv.spectral_u),
        }
    return steps


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if _is_dtensor(t) else t


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    mp.spawn(run_rank, args=(free_port(), sys.argv[1]), nprocs=WORLD_SIZE)
