"""One gloo rank of the kNN distributed test.

Usage: ``python knn_worker.py RANK WORLD INIT TRAIN EVAL OUT``.

Runs :class:`~radio_lit.evaluation.KNNClassification` on the mean-colour view over the given
labeled folders (each rank embeds its share) and saves the report's scalars.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from radio_lit.evaluation import KNNClassification
from tests.evaluation.synthetic import mean_color_view


def main(rank: int, world: int, init: str, train: str, evaluation: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    measure = KNNClassification(train, evaluation, crop_size=32, batch_size=5, k=5)
    torch.save(measure.evaluate(mean_color_view()).scalars, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:7])
