"""One gloo rank of the segmentation probe's distributed test.

Usage: ``python segmentation_worker.py RANK WORLD INIT ROOT OUT``.

Trains and scores :class:`~radio_lit.evaluation.SegmentationProbe`'s head on a view whose every
forward is a collective (as an FSDP student's is), and saves the head, the score and the
number of forwards.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from radio_lit.evaluation import ModelView, SegmentationFolder, SegmentationProbe
from radio_lit.teachers import TeacherOutput


def main(rank: int, world: int, init: str, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    calls = []

    def patch_colours(images: torch.Tensor) -> dict[str, TeacherOutput]:
        dist.all_reduce(torch.zeros(1))  # a collective per forward, as under FSDP
        calls.append(images.shape[0])
        features = F.avg_pool2d(images, 16).permute(0, 2, 3, 1)  # [B, h, w, 3]
        return {"backbone": TeacherOutput(features.mean((1, 2)), features)}

    view = ModelView(patch_colours, (32, 32), 16)
    probe = SegmentationProbe(root, num_classes=10, steps=3, warmup_steps=1, batch_size=2)
    with torch.no_grad():
        head = probe.train_head(view, SegmentationFolder(root, "training"), 32)
        score = probe.score(view, head, SegmentationFolder(root, "validation"), 32)
    torch.save({"head": head.state_dict(), "score": score, "calls": len(calls)}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6])
