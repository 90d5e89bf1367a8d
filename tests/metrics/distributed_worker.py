"""One gloo rank of ``test_metrics_agree_between_one_and_two_processes``.

Usage: ``python distributed_worker.py RANK WORLD_SIZE INIT_FILE INPUT OUTPUT``. ``INPUT`` (written
by the test) holds the normalizer states and each rank's batches of matches; the rank adds its
batches to :class:`DistillationMetrics`, computes them (torchmetrics reduces the states over
both ranks), feeds its own loss values to an :class:`AdaLoss`, and saves both results.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from radio_lit.losses import AdaLoss
from radio_lit.metrics import DistillationMetrics
from radio_lit.training.matching import TeacherMatch
from tests.metrics.test_metrics_distributed import TEACHERS, TERMS, normalizers


def main(rank: int, world_size: int, init_file: str, source: str, output: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    data = torch.load(source)
    metrics = DistillationMetrics(TEACHERS)
    for batch in data["batches"][rank]:
        metrics.update({name: TeacherMatch(**m) for name, m in batch.items()}, normalizers(data))
    values = metrics.compute()

    balancer = AdaLoss(TERMS, momentum=0.5)
    balancer.observe([data["losses"][rank]], [1.0])
    torch.save({"values": values, "average": balancer.average, "seen": balancer.seen}, output)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
