"""Zero-shot classification with the CLIP teacher's text tower (AM-RADIO 3.1; CLIP)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.evaluation import ModelView, ZeroShotClassification, zero_shot_weights
from radio_lit.evaluation.data import LabeledImageFolder
from radio_lit.teachers import OpenCLIPTeacher, TeacherOutput
from tests.evaluation.synthetic import MeanColor, overlapping_root
from tests.teachers.tiny import TINY_CLIP_CFG, tiny_clip_teacher

#: One text prototype per class: its "text embedding" (an identity text tower passes it on).
PROTOTYPES = {
    "a": [1.0, -0.2, -0.2],
    "b": [-0.2, 1.0, -0.2],
    "c": [-0.2, -0.2, 1.0],
    "d": [-1.0, -1.0, -1.0],
}


class IdentityTextTower:
    """``encode_text`` returns its input: the tokens *are* the embeddings."""

    context_length = 8

    def encode_text(self, tokens: Tensor, normalize: bool = False) -> Tensor:
        return F.normalize(tokens, dim=-1) if normalize else tokens


def prototype_tokenizer(texts: list[str]) -> Tensor:
    return torch.tensor([PROTOTYPES[text] for text in texts])


class ClipLikeTeacher(nn.Module):
    """A teacher with a text tower whose image embedding is the mean colour (like the student)."""

    def __init__(self) -> None:
        super().__init__()
        self.clip = IdentityTextTower()
        self.student = MeanColor()

    def forward(self, images: Tensor) -> TeacherOutput:
        return self.student(images)["backbone"]


class StudentWithClipHead(nn.Module):
    def forward(self, images: Tensor) -> dict[str, TeacherOutput]:
        return {"clip": MeanColor()(images)["backbone"]}


def test_identity_text_tower_gives_nearest_prototype_classification(tmp_path, monkeypatch):
    _, evaluation = overlapping_root(tmp_path)
    monkeypatch.setattr(
        "radio_lit.evaluation.zero_shot.open_clip.get_tokenizer",
        lambda *args, **kwargs: prototype_tokenizer,
    )
    view = ModelView(StudentWithClipHead(), (32, 32), 16, {"clip": ClipLikeTeacher()})
    measure = ZeroShotClassification("clip", str(evaluation), templates=["{}"], crop_size=32)
    scalars = measure.evaluate(view).scalars

    folder = LabeledImageFolder(evaluation, 32)
    prototypes = F.normalize(torch.tensor(list(PROTOTYPES.values())), dim=1)
    correct = top2 = 0
    for image, label in folder:
        color = image.float().div(255).mean(dim=(1, 2)) - 0.5
        ranking = (F.normalize(color, dim=0) @ prototypes.T).argsort(descending=True)
        correct += int(ranking[0] == label)
        top2 += int(label in ranking[:2])
    assert scalars["eval/zero_shot/clip/top1"] == pytest.approx(100 * correct / len(folder))
    assert 0 < correct < len(folder)  # neither trivial nor hopeless
    assert "eval/zero_shot/clip/top5" not in scalars  # 4 classes: no top-5
    # The teacher is the student here: same predictions, full agreement.
    assert scalars["eval/zero_shot/clip/teacher_top1"] == scalars["eval/zero_shot/clip/top1"]
    assert scalars["eval/zero_shot/clip/agreement"] == 100.0


def test_class_weights_from_a_real_open_clip_text_tower():
    config = copy.deepcopy(TINY_CLIP_CFG)
    config["text_cfg"]["vocab_size"] = 49408  # CLIP's BPE vocabulary
    teacher = OpenCLIPTeacher("radio-lit-tiny-clip", model_cfg=config, keep_text=True)
    tokenizer = __import__("open_clip").get_tokenizer("", context_length=8)
    weights = zero_shot_weights(teacher.clip, tokenizer, ["cat", "dog", "car"], ["a {}.", "{}"])
    assert weights.shape == (32, 3)
    torch.testing.assert_close(weights.norm(dim=0), torch.ones(3))


def test_a_teacher_without_its_text_tower_is_a_clear_error(tmp_path):
    view = ModelView(StudentWithClipHead(), (32, 32), 16, {"clip": tiny_clip_teacher()})
    with pytest.raises(ValueError, match="keep_text: true"):
        ZeroShotClassification("clip", crop_size=32).evaluate(view)


def test_a_tokenizer_beyond_the_text_vocabulary_is_a_clear_error():
    view = ModelView(
        StudentWithClipHead(), (32, 32), 16, {"clip": tiny_clip_teacher(keep_text=True)}
    )
    with pytest.raises(ValueError, match="vocab_size 64"):
        ZeroShotClassification("clip", crop_size=32, per_class=1).evaluate(view)
