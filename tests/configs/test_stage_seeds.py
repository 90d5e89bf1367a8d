"""Each stage of a multi-stage recipe draws its own randomness: its own crops and their order,
view shifts, DAMP noise, CPE windows and dropout, and ViTDet schedule. Every stage starts from
the one before (``model.init_from``); with one seed for all of them, stage 2 would replay
stage 1's draws step for step. The recipes give each stage its own ``seed_everything`` (the
step's draws) and ``data.init_args.seed`` (the crops): the stage number."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks.gpu_check import stage_chains
from radio_lit.data.resumable import sample_seed
from radio_lit.training.random_streams import RankStream
from radio_lit.training.student_step import FORWARD_STREAM, SHIFT_STREAM, run_seed
from radio_lit.training.views import step_views
from tests.configs.shipped import CONFIGS, cpu_sized, raw

CHAINS = stage_chains(list(CONFIGS.values()))


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_every_stage_of_a_recipe_has_its_own_seeds(chain):
    stages = [raw(config.name) for config in CHAINS[chain]]
    runs = [stage["seed_everything"] for stage in stages]
    data = [stage["data"]["init_args"]["seed"] for stage in stages]
    assert len(set(runs)) == len(runs) and len(set(data)) == len(data), (runs, data)


def test_no_rank_stream_draws_what_a_crop_draws():
    """The recipes give a stage's ``seed_everything`` and ``data.init_args.seed`` one number
    k: rank r's streams (seeded from k, r and their purpose) must not be seeded as the crop of
    an image in an epoch (seeded from k, the epoch and the index)."""
    stages = [raw(config.name) for chain in CHAINS.values() for config in chain]
    seeds = {s["seed_everything"] for s in stages} | {
        s["data"]["init_args"]["seed"] for s in stages
    }
    epochs, images = range(8), range(64)
    crops = {sample_seed(k, epoch, index) for k in seeds for epoch in epochs for index in images}
    for k in seeds:
        for rank in range(8):
            for purpose in (FORWARD_STREAM, SHIFT_STREAM):
                stream = RankStream(purpose)
                stream.start(k, rank)
                assert stream.seed not in crops, (k, rank, purpose)


def _first_draws(name: str, weights: dict[str, torch.Tensor] | None, crops=None) -> dict[str, list]:
    """What stage ``name`` (at CPU size) draws first: its first batch of crops; on ``crops``
    (default: that batch), the first step's view shifts and a training forward of the
    student (given ``weights``) at the stage's resolution with one ViTDet choice for every
    stage (what the forward stream draws: DAMP's noise, the CPE's windows and dropout); the
    ViTDet schedule of 32 steps."""
    cli = cpu_sized(name, "--model.init_from=null")
    module, data = cli.model, cli.datamodule
    assert run_seed() == int(os.environ["PL_GLOBAL_SEED"]) == raw(name)["seed_everything"]
    if weights is not None:
        module.student.load_state_dict(weights)
    data.setup("fit")
    own = next(iter(data.train_dataloader()))
    crops = own if crops is None else crops
    step = module.student_step
    step.begin(module.student, step=0, rank=0)
    chunks = step_views(crops, module.partitions, step, module.teachers, train=True)
    module.train()
    module.student.begin_step(seed=0, step=0)  # the same ViTDet choice for every stage
    with torch.no_grad():
        forward = step.run(module.student, chunks[0].crop, module.student_resolution, None, True)
    side = min(module.student.vitdet_window_sizes)  # a grid only that window tiles
    windowed = []
    for index in range(32):
        module.student.begin_step(run_seed(), index)
        windowed.append(module.student.vitdet_window((side, side)) is not None)
    return {
        "crops": [own],
        "shifts": [s for c in chunks for s in (c.shifts.student, *c.shifts.teachers.values())],
        "forward": [forward.features, forward.summary],
        "vitdet": [torch.tensor(windowed)],
        "weights": module.student.state_dict(),
        "batch": crops,
    }


@pytest.mark.slow
def test_chained_stages_draw_different_crops_shifts_noise_and_vitdet():
    """C-RADIOv4 stages 1 and 2 (one config but for the seeds), stage 2 from stage 1's
    student weights (as init_from gives them), the shifts and the forward on stage 1's crops
    at one resolution: each draw differs, so only the stage's seed can make it differ;
    stage 1 built again draws the same (the difference is the seeds', not chance)."""
    first = _first_draws("recipes/c-radio/stage1.yaml", None)
    again = _first_draws("recipes/c-radio/stage1.yaml", first["weights"], first["batch"])
    second = _first_draws("recipes/c-radio/stage2.yaml", first["weights"], first["batch"])
    for what in ("crops", "shifts", "forward", "vitdet"):
        assert all(map(torch.equal, first[what], again[what])), what
        assert not all(map(torch.equal, first[what], second[what])), what
