"""One gloo rank of ``test_two_ranks_draw_their_own_views_and_dropout`` (tests/upsamplers).

Both ranks build the same FeatSharpModule (same seed) around a tiny CLIP teacher, start its
streams for their global rank (as ``on_train_start`` does) and draw one training step's
jittered views and logit-dropout mask through the module's own code; then gather every rank's
stream states as a checkpoint does (``on_save_checkpoint``), draw the next step, restore
their own states into a fresh module and draw that step again. Saves what each drew.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from radio_lit.upsamplers import FeatSharp, FeatSharpModule, FusionBlock
from radio_lit.upsamplers.module import RANDOM_STREAMS
from tests.teachers.tiny import tiny_clip_teacher


def _module() -> FeatSharpModule:
    torch.manual_seed(0)
    upsampler = functools.partial(
        FeatSharp, factor=2, fusion=functools.partial(FusionBlock, heads=2)
    )
    return FeatSharpModule(tiny_clip_teacher(), upsampler=upsampler).train()


def _draw(module: FeatSharpModule, images: torch.Tensor) -> list[torch.Tensor]:
    """One step's draws: the views and their matrices (the views stream) and the dropout's
    effect, the downsampler's output on a fixed map (the dropout stream)."""
    with module.streams["views"].active(images.device):
        views, matrices = module.views(images)
    fixed = torch.randn(2, 64, 8, 8, generator=torch.Generator().manual_seed(2))
    with module.streams["dropout"].active(images.device):
        lowered = module.downsampler(fixed)
    return [views, matrices, lowered.detach()]


def main(rank: int, world_size: int, init_file: str, output: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    module = _module()
    images = torch.rand(2, 3, 112, 112, generator=torch.Generator().manual_seed(1))
    module.start_streams(rank)
    global_state = torch.get_rng_state()
    first = _draw(module, images)
    untouched = torch.equal(global_state, torch.get_rng_state())
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)  # every rank's states, gathered
    second = _draw(module, images)
    resumed = _module()  # a fresh module, as a resumed run builds
    resumed.load_streams(checkpoint[RANDOM_STREAMS], world_size, rank)
    resumed.start_streams(rank)  # restored: no new seed
    again = _draw(resumed, images)
    torch.save(
        {
            "first": first,
            "second": second,
            "again": again,
            "ranks": checkpoint[RANDOM_STREAMS],
            "global": untouched,
        },
        output,
    )
    dist.destroy_process_group()
