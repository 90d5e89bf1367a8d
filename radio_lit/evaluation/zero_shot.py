"""Zero-shot classification with the CLIP teacher's text tower (AM-RADIO section 3.1;
NVlabs/RADIO ``examples/zero_shot_imagenet.py``; CLIP, Radford et al. 2021).

Each class name is written into every prompt template, encoded by the teacher's text tower and
L2-normalized; the mean over templates, normalized again, is the class's weight vector
(``open_clip.build_zero_shot_classifier``). The student's summary through that teacher's
summary head is scored against every class by cosine similarity; top-1 and top-5 accuracy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import open_clip
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from radio_lit.data.views import as_float_images
from radio_lit.evaluation.base import Evaluation, Report
from radio_lit.evaluation.data import SAMPLE_CLASSES, labeled_images, rank_batches
from radio_lit.evaluation.view import ModelView

#: Named prompt template sets from open_clip.
TEMPLATES: dict[str, Sequence[Callable[[str], str]]] = {
    "openai": open_clip.OPENAI_IMAGENET_TEMPLATES,  # CLIP's 80 ImageNet prompts
    "simple": open_clip.SIMPLE_IMAGENET_TEMPLATES,
}


def zero_shot_weights(
    encoder: object,
    tokenizer: Callable[[list[str]], Tensor],
    class_names: Sequence[str],
    templates: Sequence[str | Callable[[str], str]],
    device: torch.device | str = "cpu",
) -> Tensor:
    """``[C_s, K]`` class weight vectors: the normalized mean of the normalized prompt
    embeddings ``encoder.encode_text(tokenizer(prompts), normalize=True)`` of each class."""
    return open_clip.build_zero_shot_classifier(
        encoder, tokenizer, list(class_names), list(templates), device=device
    ).float()


class ZeroShotClassification(Evaluation):
    """Zero-shot top-1 / top-5 accuracy of the student's summary through a CLIP teacher's head.

    Logs ``eval/zero_shot/<teacher>/top1`` and ``top5`` (percent; top-5 with at least 5
    classes), ``teacher_top1`` (the teacher's own image embedding, the reference; computed once)
    and ``agreement``: the percentage of images where the student's top-1 class is the
    teacher's. With random-weight teachers (the quickstart) accuracy is near chance for teacher
    and student alike; agreement still tells how closely the student reproduces the teacher.

    The teacher needs its text tower: build it with ``keep_text: true``
    (:class:`~radio_lit.teachers.OpenCLIPTeacher`).

    Cost per image: one student forward at ``resolution`` and one ``[C_s] x [C_s, K]`` product;
    one teacher image forward on the first run only. The class weights (``K x templates`` text
    forwards) are computed once.

    Args:
        teacher: name of the CLIP teacher (and of its summary head).
        eval_dir: labeled folder (``<class>/<images>``) or ``"radio_lit:sample_classes"``.
        class_names: the text for each class, in the sorted order of the class folders
            (ImageNet: ``open_clip.IMAGENET_CLASSNAMES`` follows the sorted wnids); default the
            folder names with ``_`` read as spaces; ``"imagenet"`` for open_clip's names.
        templates: ``"openai"`` (CLIP's 80 ImageNet prompts), ``"simple"``, or format strings
            such as ``["a photo of a {}."]``.
        tokenizer: open_clip model name whose tokenizer to use (``open_clip.get_tokenizer``);
            default CLIP's BPE tokenizer, at the text tower's context length.
        crop_size: images are resized (short side) and center-cropped to this side.
        resolution: student input side; default the model's training resolution.
        per_class: crops per photograph for ``"radio_lit:sample_classes"``.
        batch_size: images per forward.
        num_workers: DataLoader workers.
        every_n_steps: see :class:`~radio_lit.evaluation.base.Evaluation`.
    """

    reads_summaries = True

    def __init__(
        self,
        teacher: str = "clip",
        eval_dir: str = SAMPLE_CLASSES,
        class_names: list[str] | str | None = None,
        templates: list[str] | str = "openai",
        tokenizer: str | None = None,
        crop_size: int = 224,
        resolution: int | None = None,
        per_class: int = 8,
        batch_size: int = 32,
        num_workers: int = 0,
        every_n_steps: int = 1000,
    ) -> None:
        super().__init__(every_n_steps)
        if isinstance(templates, str) and templates not in TEMPLATES:
            raise ValueError(
                f"templates={templates!r} is not a named set ({sorted(TEMPLATES)}); give one of "
                "them or a list of format strings such as ['a photo of a {}.']"
            )
        if isinstance(class_names, str) and class_names != "imagenet":
            raise ValueError(f"class_names must be a list or 'imagenet', got {class_names!r}")
        self.teacher = teacher
        self.eval_dir = eval_dir
        self.class_names = (
            list(open_clip.IMAGENET_CLASSNAMES) if class_names == "imagenet" else class_names
        )
        self.templates = TEMPLATES[templates] if isinstance(templates, str) else list(templates)
        self.tokenizer = tokenizer
        self.crop_size, self.resolution, self.per_class = crop_size, resolution, per_class
        self.batch_size, self.num_workers = batch_size, num_workers
        self._weights: Tensor | None = None
        self._teacher_predictions: dict[int, Tensor] = {}

    def outputs_read(self) -> list[str]:
        return [self.teacher]

    def required_teachers(self) -> list[str]:
        return [self.teacher]

    def class_weights(self, view: ModelView, classes: list[str]) -> Tensor:
        """``[C_s, K]`` text weights from the teacher's text tower (computed once)."""
        if self._weights is None:
            teacher = view.teachers.get(self.teacher)
            clip = getattr(teacher, "clip", None)
            if teacher is None:
                raise ValueError(
                    f"zero-shot needs the text tower of teacher {self.teacher!r}, which this "
                    "model does not run (an exported model, or a run from a teacher-feature "
                    "cache): evaluate the checkpoint with its teachers (radio-lit evaluate "
                    "CHECKPOINT), or remove ZeroShotClassification from this run"
                )
            if clip is None:
                raise ValueError(
                    f"zero-shot needs the text tower of teacher {self.teacher!r}: set "
                    f"model.teachers.{self.teacher}.init_args.keep_text: true (an "
                    "OpenCLIPTeacher), or point ZeroShotClassification.teacher at such a teacher"
                )
            names = self.class_names or [c.replace("_", " ") for c in classes]
            if len(names) != len(classes):
                raise ValueError(
                    f"class_names has {len(names)} names but {self.eval_dir} has {len(classes)} "
                    "classes; give one name per class folder, in sorted folder order"
                )
            tokenizer = open_clip.get_tokenizer(
                self.tokenizer or "", context_length=clip.context_length
            )
            _check_vocabulary(tokenizer, clip, self.templates, names)
            self._weights = zero_shot_weights(clip, tokenizer, names, self.templates, view.device)
        return self._weights

    def evaluate(self, view: ModelView) -> Report:
        dataset = labeled_images(self.eval_dir, "eval", self.crop_size, self.per_class)
        classes = dataset.classes  # type: ignore[attr-defined]
        weights = self.class_weights(view, classes)
        num_classes = len(classes)
        device = view.device
        metrics = {
            k: MulticlassAccuracy(num_classes, top_k=k, average="micro").to(device)
            for k in (1, 5)
            if k <= num_classes
        }
        agreement = MulticlassAccuracy(num_classes, average="micro").to(device)
        teacher_metric = MulticlassAccuracy(num_classes, average="micro").to(device)
        batches = rank_batches(dataset, self.batch_size, self.num_workers)
        for i, ((images, labels), valid) in enumerate(batches):
            images, labels, valid = (
                as_float_images(images.to(device)),
                labels.to(device),
                valid.to(device),
            )
            summary = view(images, self.resolution)[self.teacher].summary
            logits = F.normalize(summary.float(), dim=-1) @ weights
            if i not in self._teacher_predictions:
                reference = view.teacher_outputs(images, [self.teacher])[self.teacher].summary
                self._teacher_predictions[i] = (
                    F.normalize(reference.float(), dim=-1) @ weights
                ).argmax(1)
            teacher_top1 = self._teacher_predictions[i]
            for metric in metrics.values():
                metric.update(logits[valid], labels[valid])
            agreement.update(logits[valid], teacher_top1[valid])
            teacher_metric.update(
                F.one_hot(teacher_top1[valid], num_classes).float(), labels[valid]
            )
        prefix = f"eval/zero_shot/{self.teacher}"
        scalars = {f"{prefix}/top{k}": 100.0 * float(m.compute()) for k, m in metrics.items()}
        scalars[f"{prefix}/agreement"] = 100.0 * float(agreement.compute())
        scalars[f"{prefix}/teacher_top1"] = 100.0 * float(teacher_metric.compute())
        return Report(scalars=scalars)


def _check_vocabulary(tokenizer, clip, templates, names) -> None:
    """Fail clearly if the tokenizer's ids do not fit the text tower's embedding table."""
    vocabulary = getattr(clip, "vocab_size", None)
    if vocabulary is None:
        return
    sample = [t.format(names[0]) if isinstance(t, str) else t(names[0]) for t in templates[:1]]
    largest = int(tokenizer(sample).max())
    if largest >= vocabulary:
        raise ValueError(
            f"the tokenizer produces token id {largest} but the teacher's text tower has "
            f"vocab_size {vocabulary}: give ZeroShotClassification.tokenizer the open_clip model "
            "name of this teacher, or a text tower with CLIP's vocabulary (49408)"
        )
