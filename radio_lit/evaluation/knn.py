"""k-NN classification through the summary (AM-RADIO section 3.1; NVlabs/RADIO
``examples/knn_classification.py``).

Every training image's summary is L2-normalized and stored with its label; each evaluation
image's normalized summary takes its ``k = 20`` most cosine-similar training summaries, each
voting for its label with weight ``exp(similarity / 0.07)`` (Wu et al. 2018, section 3.4, as
in DINO and RADIO), and the label with the most weight is the prediction; top-1 accuracy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from radio_lit.data.views import as_float_images
from radio_lit.evaluation.base import Evaluation, Report
from radio_lit.evaluation.data import SAMPLE_CLASSES, gather, labeled_images, rank_batches
from radio_lit.evaluation.view import BACKBONE, ModelView

_QUERY_CHUNK = 1024  # queries scored against the whole bank at a time


def knn_votes(
    bank: Tensor,
    bank_labels: Tensor,
    queries: Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
) -> Tensor:
    """Similarity-weighted k-NN votes.

    Args:
        bank: ``[M, D]`` L2-normalized training embeddings.
        bank_labels: ``[M]`` their class indices.
        queries: ``[Q, D]`` L2-normalized embeddings to classify.
        num_classes: number of classes ``K``.
        k: neighbours per query (all ``M`` if fewer).
        temperature: vote weight ``exp(cosine / temperature)``.

    Returns:
        ``[Q, K]`` summed vote weight per class; the prediction is its argmax.
    """
    votes = torch.zeros(queries.shape[0], num_classes, dtype=queries.dtype, device=queries.device)
    k = min(k, bank.shape[0])
    for start in range(0, queries.shape[0], _QUERY_CHUNK):
        similarity = queries[start : start + _QUERY_CHUNK] @ bank.T
        top, index = similarity.topk(k, dim=1)
        votes[start : start + _QUERY_CHUNK].scatter_add_(
            1, bank_labels[index], (top / temperature).exp()
        )
    return votes


class KNNClassification(Evaluation):
    """k-NN top-1 accuracy of the student's summary on a labeled image folder.

    Logs ``eval/knn/<output>/top1`` (percent) for each summary in ``outputs`` (``backbone``:
    the student's own summary token; a teacher's name: the student's summary through that
    teacher's adaptor head) and, once (the teachers are frozen), ``eval/knn/<teacher>/
    teacher_top1``: the same protocol on the teacher's own summary, the reference to reach.

    Cost per image: one student forward at ``resolution`` (train and eval splits once per run),
    one teacher forward per compared teacher on the first run only, and a ``[Q, M]`` similarity
    product (``M`` training images) for the vote.

    Distributed: each rank embeds its share of both splits; the training bank is gathered on
    every rank, each rank votes for its own evaluation images, and the accuracy is reduced by
    torchmetrics. Memory: the bank takes ``4 * D`` bytes per training image on every rank
    (ImageNet-1k's 1.28M images at D = 1024: 5.2 GB).

    Args:
        train_dir: labeled folder (``<class>/<images>``) the bank is built from, or
            ``"radio_lit:sample_classes"`` (crops of the shipped photographs).
        eval_dir: labeled folder of the images to classify (same class folders), or
            ``"radio_lit:sample_classes"`` (other crops of the same photographs).
        outputs: summaries to evaluate: ``"backbone"`` and/or teacher names.
        k: neighbours (20 in AM-RADIO and RADIO's script).
        temperature: vote temperature (0.07).
        crop_size: images are resized (short side) and center-cropped to this side.
        resolution: student input side; default the model's training resolution.
        per_class: crops per photograph for ``"radio_lit:sample_classes"``.
        compare_teachers: also report each named teacher's own k-NN accuracy.
        batch_size: images per forward.
        num_workers: DataLoader workers decoding the folders.
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    reads_summaries = True

    def __init__(
        self,
        train_dir: str = SAMPLE_CLASSES,
        eval_dir: str = SAMPLE_CLASSES,
        outputs: list[str] | None = None,
        k: int = 20,
        temperature: float = 0.07,
        crop_size: int = 224,
        resolution: int | None = None,
        per_class: int = 8,
        compare_teachers: bool = True,
        batch_size: int = 32,
        num_workers: int = 0,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        if k < 1 or temperature <= 0:
            raise ValueError(
                f"KNNClassification: need k >= 1 and temperature > 0, got {k}, {temperature}"
            )
        self.train_dir, self.eval_dir = train_dir, eval_dir
        self.outputs = list(outputs) if outputs is not None else [BACKBONE]
        self.k, self.temperature = k, temperature
        self.crop_size, self.resolution, self.per_class = crop_size, resolution, per_class
        self.compare_teachers = compare_teachers
        self.batch_size, self.num_workers = batch_size, num_workers
        self._teacher_scalars: dict[str, float] | None = None

    def evaluate(self, view: ModelView) -> Report:
        train = labeled_images(self.train_dir, "train", self.crop_size, self.per_class)
        evaluation = labeled_images(
            self.eval_dir, "eval", self.crop_size, self.per_class, getattr(train, "classes", None)
        )
        num_classes = len(train.classes)  # type: ignore[attr-defined]
        resolution = self.resolution

        def student(images: Tensor) -> dict[str, Tensor]:
            out = view(images, resolution)
            return {name: _summary(out, name) for name in self.outputs}

        report = Report(scalars=self._accuracies(student, train, evaluation, num_classes, view))
        if self.compare_teachers:
            if self._teacher_scalars is None:
                names = [
                    n for n in self.outputs if getattr(view.teachers.get(n), "summary_dim", None)
                ]

                def teachers(images: Tensor) -> dict[str, Tensor]:
                    out = view.teacher_outputs(images, names)
                    return {n: _summary(out, n) for n in names}

                accuracies = (
                    self._accuracies(teachers, train, evaluation, num_classes, view)
                    if names
                    else {}
                )
                self._teacher_scalars = {
                    tag.replace("/top1", "/teacher_top1"): v for tag, v in accuracies.items()
                }
            report.scalars.update(self._teacher_scalars)
        return report

    def _accuracies(
        self, embed, train, evaluation, num_classes: int, view: ModelView
    ) -> dict[str, float]:
        bank, bank_labels = self._embed(embed, train, view)
        queries, labels = self._embed(embed, evaluation, view)
        scalars = {}
        for name in bank:
            votes = knn_votes(
                gather(bank[name]),
                gather(bank_labels),
                queries[name],
                num_classes,
                self.k,
                self.temperature,
            )
            metric = MulticlassAccuracy(num_classes, average="micro").to(votes.device)
            metric.update(votes, labels)
            scalars[f"eval/knn/{name}/top1"] = 100.0 * float(metric.compute())
        return scalars

    def _embed(self, embed, dataset, view: ModelView) -> tuple[dict[str, Tensor], Tensor]:
        """This rank's normalized embeddings ``{name: [n, D]}`` and labels ``[n]``."""
        chunks: dict[str, list[Tensor]] = {}
        labels = []
        device = view.device
        for (images, batch_labels), valid in rank_batches(
            dataset, self.batch_size, self.num_workers
        ):
            out = embed(as_float_images(images.to(device)))
            for name, summary in out.items():
                chunks.setdefault(name, []).append(
                    F.normalize(summary.float(), dim=-1)[valid.to(device)]
                )
            labels.append(batch_labels.to(device)[valid.to(device)])
        return {n: torch.cat(c) for n, c in chunks.items()}, torch.cat(labels)


def _summary(outputs: dict, name: str) -> Tensor:
    if name not in outputs:
        raise ValueError(
            f"evaluation output {name!r} does not exist; the model returns {sorted(outputs)}"
        )
    summary = outputs[name].summary
    if summary is None:
        raise ValueError(f"{name!r} has no summary (e.g. SAM); pick another output for kNN")
    return summary
