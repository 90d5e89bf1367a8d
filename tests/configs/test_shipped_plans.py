"""Every shipped distillation config planned by ``radio-lit plan``'s counting on this CPU: a
CPU-sized config's shared build (:mod:`tests.configs.shipped`) at its own world, a GPU recipe
at CPU size (:func:`~tests.configs.shipped.cpu_sized`: tiny teachers of the same families, a
2-block student of its family, its partitions one rank's share, one rank; a build of its own,
hence ``slow``), each distinct rank counted on fake tensors, then the stage's plan. (The real
sizes: ``tests/planning/test_measured_runs.py``; ``configs/featsharp`` trains a module of its
own, which ``radio-lit plan`` refuses.)"""

from __future__ import annotations

import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from benchmarks.gpu_check import own_module, world_size
from radio_lit.planning.counting import count_step, fake_module
from radio_lit.planning.devices import calibration, device
from radio_lit.planning.plan import distinct_ranks, plan_stage
from radio_lit.planning.repeated_blocks import BlockRecords
from tests.configs.shipped import CONFIGS, built, cpu_sized, gpu_recipe, layout_overlay, raw

#: Not the overlays that only lay a recipe's partitions out anew (balanced, packed): planned
#: beside the recipe by ``--compare-layouts`` (tests/planning/test_plan_command.py), counted
#: packed by tests/planning/test_packed_count.py; each steps in test_shipped_steps.py.
NAMES = [
    pytest.param(name, marks=[pytest.mark.slow] if gpu_recipe(name) else [])
    for name in CONFIGS
    if not own_module(raw(name)) and not layout_overlay(name)
]


def _forwards(module, teachers):
    """The rank's teachers grouped by the model they run: a RADIO's entries share one model
    and its one forward per view (``RADIOTeacher.source``), counted under the first of them."""
    groups = {}
    for name in sorted(teachers):
        source = getattr(module.teachers[name], "source", None)
        groups.setdefault(id(source) if source is not None else name, []).append(name)
    return groups.values()


@pytest.mark.parametrize("name", NAMES)
def test_plan_counts_the_config(name):
    cli = cpu_sized(name, "--model.init_from=null") if gpu_recipe(name) else built(name)
    module = copy.deepcopy(cli.model)  # the shared build stays real
    gpus = 1 if gpu_recipe(name) else world_size(raw(name))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_module(module, mode)
    data = cli.datamodule
    counts = {}
    for rank in distinct_ranks(module.partitions, gpus):
        module.partitions.place(gpus, rank)
        batch = module.partitions.rank_batch_size() or data.batch_size
        counts[rank] = count_step(module, mode, data.crop_size, batch, None, gpus, rank)
    stage = plan_stage(
        module,
        cli.trainer,
        counts,
        config=name,
        gpus=gpus,
        device=device("h100"),
        fit=calibration(),
        optimizer=raw(name)["model"].get("optimizer") or {},
        data_batch=data.batch_size,
        crop_size=data.crop_size,
        cache_images=1000,
        cache_dtype=torch.float32,
    )
    plan = module.partitions
    for rank in stage.ranks:
        teachers = {t for p in rank.partitions for t in plan.members[p]}
        parts = rank.flops_per_image
        for shared in _forwards(module, teachers):  # entries of one RADIO run it once
            assert any(parts.get(f"teacher {t}", 0) > 0 for t in shared), (rank.rank, parts)
        assert parts["student forward"] > 0 and parts["backward"] > parts["student forward"]
        assert rank.memory_gib["total"] > rank.memory_gib["step peak"] > 0
        assert set(rank.images) == set(rank.partitions)
    shared = sorted(sorted(g) for g in _forwards(module, module.teachers) if len(g) > 1)
    assert sorted(sorted(g) for g in stage.parameters.get("one model", [])) == shared
    weights = {id(t): t for m in module.teachers.values() for t in [*m.parameters(), *m.buffers()]}
    once = sum(t.numel() * t.element_size() for t in weights.values()) / 2**30
    assert all(r.memory_gib["teachers"] == pytest.approx(once) for r in stage.ranks)  # held once
    assert stage.step_ms > 0 and stage.images_per_step > 0
    assert sum(stage.cache["bytes_per_view"].values()) > 0


@pytest.mark.parametrize("name", ["quickstart.yaml", "quickstart-c-radio.yaml"])
def test_replayed_blocks_count_the_step_every_block_counts(name):
    """``radio-lit plan`` counts each distinct block once and replays it
    (:mod:`radio_lit.planning.repeated_blocks`); on σReparam's step weights (quickstart), DAMP,
    MESA's EMA student, ViTDet windows and SAM3 and DINOv3 teachers (quickstart-c-radio), under
    bf16 autocast, it counts the FLOPs and shapes that counting every block counts, the peak
    and the bytes moved within 0.5 %, the host's operations within 5 % (the probe casts each
    use of a weight: autocast's cache off)."""
    cli = built(name)
    data = cli.datamodule
    counts, records = [], BlockRecords()
    for blocks in (None, records):
        module = copy.deepcopy(cli.model)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_module(module, mode)
        batch = module.partitions.rank_batch_size() or data.batch_size
        torch.manual_seed(0)  # the same ViTDet draw
        counts.append(
            count_step(module, mode, data.crop_size, batch, torch.bfloat16, blocks=blocks)
        )
    full, replayed = counts
    assert records.replays > records.probes > 0
    assert replayed.flops == full.flops
    assert replayed.ops.gemms == full.ops.gemms
    assert replayed.ops.attention == full.ops.attention
    assert replayed.peak_bytes == pytest.approx(full.peak_bytes, rel=5e-3)
    for part, moved in full.ops.moved.items():
        assert replayed.ops.moved[part] == pytest.approx(moved, rel=5e-3), part
    for part, calls in full.ops.calls.items():
        assert replayed.ops.calls[part] == pytest.approx(calls, rel=0.05), part
