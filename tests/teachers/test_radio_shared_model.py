"""One published RADIO model, one copy, one forward: RADIOTeacher entries of one source share it.

The backbone and each adaptor of a model are separate teachers of the run (their own heads,
normalizers, losses), and the model is held once and run once per view for all of them
(:mod:`radio_lit.teachers.radio_source`); ``share: false`` is the one-copy-per-entry baseline.
"""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from radio_lit.callbacks import RandomStates, TeacherStatsEstimation
from radio_lit.normalizers import PhiS
from radio_lit.teachers import RADIOTeacher
from radio_lit.training.partitions import Partition
from radio_lit.training.teachers import run_teachers
from tests.builders import cpu_trainer, image_batches, tiny_module
from tests.export.conftest import exported, trained  # noqa: F401  (fixtures)
from tests.teachers.test_radio_teacher import REFERENCE_HUBCONF, nvlabs_model  # noqa: F401

OUTPUTS = ["backbone", "clip", "dino", "sam"]


def _entries(path: Path, share: bool, **options: object) -> dict[str, RADIOTeacher]:
    """One ``RADIOTeacher`` per output of the export ``path``; an earlier test's teachers still
    in reference cycles (a fitted module) are collected first, so that they share nothing."""
    gc.collect()
    return {
        f"radio_{o}": RADIOTeacher(str(path), adaptor=o, share=share, **options) for o in OUTPUTS
    }


class StopAfterFirstEpoch(Callback):
    """Save a checkpoint at the end of the first epoch and stop: an interrupted run with the
    uninterrupted run's schedule."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer: object, module: object) -> None:
        trainer.save_checkpoint(self.path)
        trainer.should_stop = True


def _count_calls(net: torch.nn.Module) -> list[int]:
    calls = [0]
    net.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _parameters(teachers: dict[str, RADIOTeacher]) -> int:
    return sum(p.numel() for p in torch.nn.ModuleDict(teachers).parameters())


def test_entries_of_one_model_hold_one_copy(exported: Path) -> None:  # noqa: F811
    shared = _entries(exported / "student.pth", share=True)
    separate = _entries(exported / "student.pth", share=False)
    first = shared["radio_backbone"].model
    assert all(t.model is first for t in shared.values())
    one_copy = sum(p.numel() for p in first.parameters())
    assert _parameters(shared) == one_copy
    assert _parameters(separate) == len(OUTPUTS) * one_copy
    copied = copy.deepcopy(torch.nn.ModuleDict(shared))  # a module's copy: one copy of its own
    assert all(t.model is copied["radio_sam"].model for t in copied.values())
    assert copied["radio_sam"].model is not first
    calls, crop = _count_calls(copied["radio_sam"].model), torch.rand(2, 3, 64, 64)
    got = run_teachers(copied, crop, list(copied), (4, 4))
    assert calls[0] == 1
    for name, output in run_teachers(shared, crop, list(shared), (4, 4)).items():
        assert torch.equal(got[name].features, output.features)


def test_one_forward_per_view_and_the_separate_entries_outputs(exported: Path) -> None:  # noqa: F811
    """The step's teacher stage (run_teachers) runs the shared model once per crop, and every
    entry's output equals that of an entry with a model of its own."""
    shared = _entries(exported / "student.pth", share=True, resolution=64)
    separate = _entries(exported / "student.pth", share=False, resolution=64)
    calls = _count_calls(shared["radio_sam"].model)
    own_calls = [_count_calls(t.model) for t in separate.values()]
    names = list(shared)
    for seed in range(2):
        crop = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(seed))
        got = run_teachers(shared, crop, names, (4, 4))
        expected = run_teachers(separate, crop, names, (4, 4))
        assert calls[0] == seed + 1  # one forward per view for all four outputs
        for name in names:
            torch.testing.assert_close(got[name].features, expected[name].features, rtol=0, atol=0)
            if expected[name].summary is None:
                assert got[name].summary is None
            else:
                assert torch.equal(got[name].summary, expected[name].summary)
    assert [c[0] for c in own_calls] == [2] * len(OUTPUTS)
    assert shared["radio_sam"].source._kept is None  # every entry read it: nothing held


def test_views_of_other_sizes_or_pixels_run_again(exported: Path) -> None:  # noqa: F811
    """Entries at different resolutions see different views, and a changed crop (in place:
    its version counter moves) is another view: the model runs for each."""
    path = str(exported / "student.pth")
    low = RADIOTeacher(path, adaptor="clip", resolution=64)
    high = RADIOTeacher(path, adaptor="dino", resolution=96)
    assert low.model is high.model
    calls = _count_calls(low.model)
    crop = torch.rand(2, 3, 96, 96)
    run_teachers({"low": low, "high": high}, crop, ["low", "high"], (4, 4))
    assert calls[0] == 2
    before = low(crop)
    crop.mul_(0.5)
    after = high(crop, (64, 64))
    assert calls[0] == 4
    assert not torch.equal(before.features, low(crop).features)
    assert after.features.shape == (2, 4, 4, high.feature_dim)


def test_nvlabs_code_is_built_once_with_every_adaptor_asked(nvlabs_model, tmp_path) -> None:  # noqa: F811
    """NVlabs' hub code builds the adaptors it is asked for: a second entry's adaptor rebuilds
    the shared model with both, which then serves both entries in one forward, each exactly
    as an entry loading its own model with its one adaptor."""
    hub_file, _ = nvlabs_model
    (tmp_path / "hubconf.py").write_text(REFERENCE_HUBCONF)
    options = dict(loader="torch_hub", hub_repo=str(tmp_path), trust_remote_code=True)
    names = ["backbone", "siglip2-g", "dino_v3"]
    shared = {n: RADIOTeacher(str(hub_file), adaptor=n, **options) for n in names}
    separate = {n: RADIOTeacher(str(hub_file), adaptor=n, share=False, **options) for n in names}
    net = shared["backbone"].model
    assert all(t.model is net for t in shared.values()) and net.names == names[1:]
    calls = _count_calls(net)
    crop = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    got = run_teachers(shared, crop, names, (4, 4))
    expected = run_teachers(separate, crop, names, (4, 4))
    assert calls[0] == 1
    for name in names:
        torch.testing.assert_close(got[name].features, expected[name].features, rtol=0, atol=0)
        torch.testing.assert_close(got[name].summary, expected[name].summary, rtol=0, atol=0)


def test_a_run_on_shared_entries_trains_and_resumes(exported: Path, tmp_path: Path) -> None:  # noqa: F811
    """A student distilled from four outputs of one shared model: each has its own head and
    PHI-S normalizer, the student moves, the checkpoint holds no teacher weights, and a run
    resumed from it starts from exactly the saved state and trains on."""

    def module() -> object:
        torch.manual_seed(0)
        teachers = _entries(exported / "student.pth", share=True, resolution=64)
        return tiny_module(teachers=teachers, normalizer=PhiS)

    def fit(folder: str, module: object, **options: object) -> None:
        callbacks = [TeacherStatsEstimation(steps=1), RandomStates(), *options.pop("stop", [])]
        trainer = cpu_trainer(tmp_path / folder, max_steps=4, callbacks=callbacks)
        trainer.fit(module, image_batches(num_images=8), **options)

    first = module()
    assert set(first.heads) == set(first.normalizers) == {f"radio_{o}" for o in OUTPUTS}
    one_copy = sum(p.numel() for p in first.teachers["radio_clip"].model.parameters())
    assert _parameters(dict(first.teachers)) == one_copy
    start = {k: v.clone() for k, v in first.student.state_dict().items()}
    checkpoint = tmp_path / "first.ckpt"
    fit("first", first, stop=[StopAfterFirstEpoch(checkpoint)])
    assert any(not torch.equal(start[k], v) for k, v in first.student.state_dict().items())
    saved = torch.load(checkpoint, weights_only=False)
    assert not any(k.startswith("teachers.") for k in saved["state_dict"])
    assert all(first.normalizers[n].is_fitted for n in first.normalizers)
    resumed, restored = module(), StateAtStart()
    fit("resumed", resumed, ckpt_path=str(checkpoint), stop=[restored])
    for key, value in saved["state_dict"].items():
        torch.testing.assert_close(restored.state[key], value, rtol=0, atol=0, msg=key)
    assert resumed.trainer.global_step == 4


class StateAtStart(Callback):
    """The module's state dict when training starts (after a checkpoint is restored)."""

    def on_train_start(self, trainer: object, module: object) -> None:
        self.state = {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("share", [True, False])
def test_an_unknown_adaptor_is_refused_either_way(exported: Path, share: bool) -> None:  # noqa: F811
    with pytest.raises(ValueError, match=r"no adaptor 'siglip'.*\['clip', 'dino', 'sam'\]"):
        RADIOTeacher(str(exported / "student.pth"), adaptor="siglip", share=share)


def test_partitions_of_one_models_outputs_run_it_once_per_partition(
    exported: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Outputs of one model in two partitions (AM-RADIO 4): each partition's rows are their
    own view, so the model runs once per partition, and a step trains every output's head."""
    teachers = _entries(exported / "student.pth", share=True, resolution=64)
    partitions = {
        "summary": Partition(teachers=["radio_backbone", "radio_clip"], batch_size=2),
        "dense": Partition(teachers=["radio_dino", "radio_sam"], batch_size=2),
    }
    module = tiny_module(teachers=teachers, partitions=partitions)
    calls = _count_calls(teachers["radio_clip"].model)
    heads = {n: [p.clone() for p in h.parameters()] for n, h in module.heads.items()}
    cpu_trainer(tmp_path, max_steps=1).fit(module, image_batches(num_images=4, batch_size=4))
    assert calls[0] == 2  # one forward per partition, four outputs
    for name, before in heads.items():
        after = list(module.heads[name].parameters())
        assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True)), name


#: NVlabs' Hugging Face repository layout for ``backend: remote_code``, offline: a config class
#: with ``adaptor_names`` and a model whose forward is the checkpoint format's definition
#: (``tests/export/radio_reference.py``), loaded by ``AutoModel`` with ``trust_remote_code``.
REMOTE_CONFIG = """
from transformers import PretrainedConfig


class ReferenceRadioConfig(PretrainedConfig):
    model_type = "radio_reference"

    def __init__(self, checkpoint="", adaptor_names=None, **kwargs):
        self.checkpoint, self.adaptor_names = checkpoint, adaptor_names
        super().__init__(**kwargs)
"""
REMOTE_MODEL = """
from collections import namedtuple

import torch
from torch import nn
from transformers import PreTrainedModel

from tests.export.radio_reference import reference_forward

from .configuration_reference import ReferenceRadioConfig

Output = namedtuple("Output", "summary features")


class ReferenceRadioModel(PreTrainedModel):
    config_class = ReferenceRadioConfig

    def __init__(self, config):
        super().__init__(config)
        self.anchor = nn.Parameter(torch.zeros(1))
        self.names = list(config.adaptor_names or [])
        self.checkpoint = torch.load(config.checkpoint, weights_only=False)
        self.post_init()

    def forward(self, x):
        out = reference_forward(self.checkpoint, x)
        return {n: Output(*out[n]) for n in ["backbone", *self.names]}
"""


def test_remote_code_through_transformers_is_built_once_with_every_adaptor(
    nvlabs_model,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``loader: transformers, backend: remote_code`` (the shrink recipes' path): the entries'
    adaptors are set on the config before loading, the model is rebuilt once per new adaptor
    and serves every entry in one forward, as entries with models of their own do."""
    from safetensors.torch import save_file

    hub_file, _ = nvlabs_model
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "configuration_reference.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_reference.py").write_text(REMOTE_MODEL)
    auto = {
        "AutoConfig": "configuration_reference.ReferenceRadioConfig",
        "AutoModel": "modeling_reference.ReferenceRadioModel",
    }
    config = {"model_type": "radio_reference", "auto_map": auto, "checkpoint": str(hub_file)}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"anchor": torch.zeros(1)}, str(folder / "model.safetensors"))
    options = dict(loader="transformers", backend="remote_code", trust_remote_code=True)
    names = ["backbone", "siglip2-g", "dino_v3"]
    shared = {n: RADIOTeacher(str(folder), adaptor=n, **options) for n in names}
    separate = {n: RADIOTeacher(str(folder), adaptor=n, share=False, **options) for n in names}
    net = shared["dino_v3"].model
    assert all(t.model is net for t in shared.values()) and net.names == names[1:]
    calls = _count_calls(net)
    crop = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    got = run_teachers(shared, crop, names, (4, 4))
    expected = run_teachers(separate, crop, names, (4, 4))
    assert calls[0] == 1
    for name in names:
        assert torch.equal(got[name].features, expected[name].features)
        assert torch.equal(got[name].summary, expected[name].summary)


def test_model_compile_compiles_the_shared_models_call_once(
    exported: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``model.compile`` on every entry compiles the shared model's call once; its report is
    the first entry's alone, and the compiled forward serves every entry as eager does."""
    own = tmp_path / "student.pth"  # a file of its own: a source no other test holds
    own.write_bytes((exported / "student.pth").read_bytes())
    shared = _entries(own, share=True, resolution=64)
    eager = _entries(exported / "student.pth", share=False, resolution=64)
    for teacher in shared.values():
        teacher.compile(backend="eager")
    runner = shared["radio_backbone"].source.runner
    assert runner is not None and runner.compiled is not None
    assert [n for n, t in shared.items() if t.speed_runner is not None] == ["radio_backbone"]
    crop = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    got = run_teachers(shared, crop, list(shared), (4, 4))
    expected = run_teachers(eager, crop, list(eager), (4, 4))
    assert runner.compiled.stats.graphs == 1
    for name in shared:
        torch.testing.assert_close(got[name].features, expected[name].features)
