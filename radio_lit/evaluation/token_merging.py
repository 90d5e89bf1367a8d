"""Reconstruction error of output token merging (RADIOv2.5 section 4.8, table 18).

The student's output patch tokens are merged to each chosen token count with each strided sink
layout (:mod:`radio_lit.evaluation.tokens`: bipartite soft matching on the values), unmerged back
to the
grid, and the normalized MSE of the reconstruction against the unmerged tokens is averaged over
the images: table 18's measure, rows by sink layout, one column per token count.
"""

from __future__ import annotations

from torchmetrics import MeanMetric

from radio_lit.data.views import as_float_images
from radio_lit.evaluation.base import Evaluation, Report, images_of
from radio_lit.evaluation.data import SAMPLE_CLASSES, labeled_images, rank_batches, unlabeled_images
from radio_lit.evaluation.tokens import merge_tokens, normalized_reconstruction_error, unmerge
from radio_lit.evaluation.view import BACKBONE, ModelView


class TokenMerging(Evaluation):
    """Normalized reconstruction MSE after merge/unmerge, per sink layout and token count.

    Logs ``eval/token_merging/<output>/sink_<s>x<s>/tokens_<m>`` and the table as text
    (``eval/token_merging/<output>``; ``radio-lit evaluate`` prints it). A token count outside
    what a layout allows (fewer than its sinks, more than the grid) is left out (``-``).

    Defaults follow RADIOv2.5: 768 px images (a 48 x 48 grid at patch 16), sinks every 4, 6 and
    8 tokens (table 18), 196, 256 and 512 tokens (tables 12 and A1-A3).

    Args:
        token_counts: merged token counts (columns).
        sink_strides: sink layouts, one sink per ``s x s`` cell (rows).
        outputs: ``"backbone"`` and/or teacher names.
        images: labeled folder, plain image folder, ``"radio_lit:sample_classes"`` or
            ``"radio_lit:sample_images"``.
        resolution: student input side; default 768.
        crop_size: resize (short side) and center-crop side; default ``resolution``.
        per_class: crops per photograph for ``"radio_lit:sample_classes"``.
        max_images: use at most this many images of a folder (``None``: all).
        batch_size: images per forward.
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    def __init__(
        self,
        token_counts: list[int] | None = None,
        sink_strides: list[int] | None = None,
        outputs: list[str] | None = None,
        images: str = SAMPLE_CLASSES,
        resolution: int = 768,
        crop_size: int | None = None,
        per_class: int = 2,
        max_images: int | None = None,
        batch_size: int = 8,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        self.token_counts = list(token_counts or [196, 256, 512])
        self.sink_strides = list(sink_strides or [4, 6, 8])
        if min(self.token_counts) < 1 or min(self.sink_strides) < 1:
            raise ValueError(
                "TokenMerging: token_counts and sink_strides must be positive, got "
                f"{self.token_counts} and {self.sink_strides}"
            )
        self.outputs = list(outputs or [BACKBONE])
        self.images, self.resolution = images, resolution
        self.crop_size, self.per_class, self.max_images = crop_size, per_class, max_images
        self.batch_size = batch_size

    def evaluate(self, view: ModelView) -> Report:
        crop = self.crop_size or self.resolution
        if self.images == SAMPLE_CLASSES:
            dataset = labeled_images(self.images, "eval", crop, self.per_class)
        else:
            dataset = unlabeled_images(self.images, crop, self.max_images)
        device = view.device
        errors: dict[tuple[str, int, int], MeanMetric] = {}
        grid = (self.resolution // view.patch_size,) * 2
        cells = [(s, m) for s in self.sink_strides for m in self.token_counts if _fits(grid, s, m)]
        for name in self.outputs:
            for s, m in cells:
                errors[name, s, m] = MeanMetric().to(device)
        for batch, valid in rank_batches(dataset, self.batch_size):
            images = as_float_images(images_of(batch).to(device))
            valid = valid.to(device)
            outputs = view(images, self.resolution)
            for name in self.outputs:
                if name not in outputs:
                    raise ValueError(
                        f"TokenMerging.outputs names {name!r}; the model's outputs are "
                        f"{sorted(outputs)}"
                    )
                features = outputs[name].features
                for s, m in cells:
                    merged, merge = merge_tokens(features, m, s)
                    error = normalized_reconstruction_error(features, unmerge(merged, merge))
                    errors[name, s, m].update(error[valid])
        report = Report()
        for name in self.outputs:
            values = {(s, m): float(errors[name, s, m].compute()) for s, m in cells}
            for (s, m), value in values.items():
                report.scalars[f"eval/token_merging/{name}/sink_{s}x{s}/tokens_{m}"] = value
            header = " | ".join(f"{m} tokens" for m in self.token_counts)
            lines = [
                f"normalized reconstruction MSE of {name} after merge/unmerge "
                f"({grid[0]}x{grid[1]} = {grid[0] * grid[1]} tokens at {self.resolution} px)",
                "",
                f"| sink layout | {header} |",
                "| --- |" + " --- |" * len(self.token_counts),
            ]
            for s in self.sink_strides:
                row = [
                    f"{values[s, m]:.3f}" if (s, m) in values else "-" for m in self.token_counts
                ]
                lines.append(f"| {s}x{s} | " + " | ".join(row) + " |")
            report.text[f"eval/token_merging/{name}"] = "\n".join(lines)
        return report


def _fits(grid: tuple[int, int], stride: int, tokens: int) -> bool:
    """Whether ``tokens`` lies between the sink count of the layout and the grid size."""
    sinks = -(-grid[0] // stride) * -(-grid[1] // stride)
    return sinks <= tokens <= grid[0] * grid[1]
