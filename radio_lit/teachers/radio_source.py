"""One published RADIO model behind several teachers: loaded once, run once per view.

A RADIO model serves several targets: its backbone's summary and features, and each adaptor
it ships (``siglip2-g``, ``dino_v3``, ``sam3`` for C-RADIOv4). Each is a separate teacher of the
run (:class:`~radio_lit.teachers.RADIOTeacher`, one ``model.teachers`` entry per output: its
own head, normalizer, loss weights, metrics, partitions and cache records), and the entries
that name the same source share one :class:`RADIOSource`:

- **one copy**: the entries whose source options agree (``model``, ``loader``, ``backend``,
  ``hub_repo``, ``trust_remote_code``, ``dtype``, ``channels_last``, ``speed``; a file by its
  real path, size and modification time) hold the same module, built once. [choice] NVlabs'
  code (``torch_hub``, ``backend: remote_code``) builds only the adaptors it is asked for: an
  entry naming an adaptor the shared model lacks rebuilds it once with every adaptor asked
  so far (the old copy released first), so a run holds one model whose forward gives every
  entry's output. A radio-lit export holds all its heads; transformers' native
  ``RadioModel`` has only the backbone.
- **one forward per view**: the model's outputs on a view are kept (:meth:`RADIOSource.outputs`)
  until every entry sharing it has read them, keyed by the crop the step hands the teachers
  (its storage, offset, shape, strides and version counter, the crop itself held meanwhile so
  that its memory cannot be reused) and the view size: the entries at one resolution see one
  view, which the model runs on once. Entries at different resolutions, or a crop shifted for
  one entry only (``model.shifts``), are different views, each run once.
- **speed options once**: FP8 quantizes the shared model once; ``compile`` compiles its call
  once (:class:`~radio_lit.teachers.speed.EncoderRunner` on the model call, not per entry).

``share: false`` on an entry gives it a model of its own (the behaviour before sharing; the
benchmark ``benchmarks/radio_sharing.py`` compares the two).
"""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from radio_lit.teachers._errors import require_file
from radio_lit.teachers.loading import TeacherDtype, cast, download_errors
from radio_lit.teachers.speed import EncoderRunner, TeacherSpeed

__all__ = ["RADIOSource", "radio_source"]

#: The shared sources alive now, by their options (gone with the last teacher holding one).
_SOURCES: weakref.WeakValueDictionary[Hashable, RADIOSource] = weakref.WeakValueDictionary()


@dataclass
class _Kept:
    """A model's outputs on one view, until every sharing teacher has read them."""

    key: tuple[Any, ...]
    crop: Tensor  # held: its storage cannot be reused by another crop while kept
    outputs: Any
    served: set[int] = field(default_factory=set)


class RADIOSource:
    """A loaded RADIO model (NVlabs' or radio-lit's), shared by the teachers of its outputs.

    Attributes:
        net: the model (``nn.Module``; every sharing teacher's ``model``).
        patch_size: its patch size; ``preferred``: its preferred resolution (pixels per side).
        adaptors: the adaptors ``net`` was built with (NVlabs' code builds only those asked).
        runner: the speed options' runner of the model call (``None``: called plainly).
    """

    def __init__(
        self,
        model: str,
        loader: str,
        backend: str,
        hub_repo: str,
        trust_remote_code: bool,
        dtype: TeacherDtype | None,
    ) -> None:
        self.options = (model, loader, backend, hub_repo, trust_remote_code)
        self.dtype = dtype
        self.adaptors: tuple[str, ...] = ()
        self.runner: EncoderRunner | None = None
        self.teachers: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._lead: weakref.ref[nn.Module] | None = None
        self._kept: _Kept | None = None
        self.net, self.patch_size, self.preferred = self._load(())

    def _load(self, adaptors: Sequence[str]) -> tuple[nn.Module, int, int]:
        net, patch, preferred = load_radio(*self.options[:3], adaptors, *self.options[3:])
        self.adaptors = tuple(adaptors)
        return cast(net, self.dtype), patch, preferred

    def serve(self, teacher: nn.Module, adaptor: str) -> None:
        """Add ``teacher`` (an output ``adaptor``) to the teachers of this model; NVlabs'
        code is rebuilt with the adaptor when it lacks it (module docstring)."""
        builds_adaptors = self.options[1] == "torch_hub" or self.options[2] == "remote_code"
        if builds_adaptors and adaptor != "backbone" and adaptor not in self.adaptors:
            if self.adaptors or self.teachers:  # a second build: release the first
                self.net = None  # type: ignore[assignment]
                for other in self.teachers:
                    other.model = None
            self.net, self.patch_size, self.preferred = self._load([*self.adaptors, adaptor])
            for other in self.teachers:
                other.model = self.net
            if self.runner is not None:  # its FP8 layers were the first build's
                self.runner = EncoderRunner(self.call, self.net, self.runner.speed, "RADIO")
        self.teachers.add(teacher)
        if self.lead is None:
            self._lead = weakref.ref(teacher)

    def __deepcopy__(self, memo: dict[int, Any]) -> RADIOSource:
        """A copy for copied teachers (``copy.deepcopy`` of a module, e.g. a benchmark's
        template): the copied model, the copies of its teachers (``memo`` holds them), its
        runner copied as a teacher's own is, nothing kept; not shared with later entries."""
        new = copy.copy(self)
        memo[id(self)] = new
        new.net = copy.deepcopy(self.net, memo)
        new.runner = copy.deepcopy(self.runner, memo)
        new.teachers = weakref.WeakSet(copy.deepcopy(t, memo) for t in self.teachers)
        lead = self.lead
        new._lead = None if lead is None else weakref.ref(copy.deepcopy(lead, memo))
        new._kept = None
        return new

    @property
    def lead(self) -> nn.Module | None:
        """The first teacher of this model still alive (the one speed reports name)."""
        return None if self._lead is None else self._lead()

    def speed(self, speed: TeacherSpeed | None, label: str) -> EncoderRunner | None:
        """The runner of the model call with ``speed`` (built once, FP8 applied once)."""
        if speed is not None and self.runner is None:
            self.runner = EncoderRunner(self.call, self.net, speed, label)
        return self.runner

    def compile(self, option: Any, label: str) -> EncoderRunner:
        """``model.compile`` for the model call, once (``torch.compile`` arguments ``option``)."""
        if self.runner is None:
            self.runner = EncoderRunner(self.call, self.net, TeacherSpeed(), label)
        if self.runner.speed.compile is None:
            self.runner.compile(option)
        return self.runner

    def call(self, view: Tensor) -> Any:
        """The model on ``view [B, 3, H, W]`` in ``[0, 1]``: NVlabs' ``{name: (summary,
        features)}`` (features NLC), or the backbone's output alone."""
        if self.options[1] == "torch_hub":  # NVlabs' hub model takes the layout
            return self.net(view, feature_fmt="NLC")
        return self.net(view)

    def outputs(self, teacher: nn.Module, crop: Tensor | None, size: Any, view: Tensor) -> Any:
        """The model's outputs on ``view`` (made from ``crop`` at ``size``; ``crop`` ``None``:
        not kept), computed once per view (:func:`view_key`) for all the sharing teachers;
        a teacher asking again for the same view has it computed again."""
        kept, key = self._kept, None if crop is None else view_key(crop, size)
        if key is None or kept is None or kept.key != key or id(teacher) in kept.served:
            outputs = self.runner(view) if self.runner is not None else self.call(view)
            if key is None:
                return outputs
            kept = self._kept = _Kept(key, crop, outputs)
        kept.served.add(id(teacher))
        if kept.served >= {id(t) for t in self.teachers}:
            self._kept = None  # every teacher has it: nothing held between steps
        return kept.outputs


def view_key(crop: Tensor, size: tuple[int, int]) -> tuple[Any, ...]:
    """What identifies a teacher's view of ``crop`` at ``size`` within a step: the crop's
    memory (storage pointer, offset, shape, strides, dtype, device), its version counter
    (bumped by any in-place change; an inference tensor, made under ``torch.inference_mode``
    as Lightning's validation makes its batches, has none: ``None``) and the view size."""
    return (
        crop.untyped_storage().data_ptr(),
        crop.storage_offset(),
        tuple(crop.shape),
        crop.stride(),
        crop.dtype,
        crop.device,
        None if crop.is_inference() else crop._version,
        tuple(size),
    )


def radio_source(
    model: str,
    loader: str,
    backend: str,
    hub_repo: str,
    trust_remote_code: bool,
    dtype: TeacherDtype | None,
    sharing: Hashable | None,
) -> RADIOSource:
    """The shared source of these options (built at the first request), or, for ``sharing``
    ``None``, a source of its own; ``sharing`` is what else must agree (channels-last,
    speed options)."""
    check_options(loader, backend)
    if sharing is None:
        return RADIOSource(model, loader, backend, hub_repo, trust_remote_code, dtype)
    where = _identity(model, loader)
    key = (where, loader, backend, _identity(hub_repo, "hub"), trust_remote_code, dtype, sharing)
    source = _SOURCES.get(key)
    if source is None:
        source = RADIOSource(model, loader, backend, hub_repo, trust_remote_code, dtype)
        _SOURCES[key] = source
    return source


def _identity(name: str, loader: str) -> Hashable:
    """A file or folder by its real path (a file also by size and modification time: a
    rewritten export is another model); a hub id or version as written."""
    path = os.path.expanduser(name)
    if os.path.isfile(path):
        stat = os.stat(path)
        return (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    return os.path.realpath(path) if os.path.isdir(path) else name


def check_options(loader: str, backend: str) -> None:
    """Refuse a ``loader`` / ``backend`` pair that does not exist, in one line."""
    if backend not in ("native", "remote_code"):
        raise ValueError(f"unknown backend {backend!r}; use native or remote_code.")
    if loader not in ("export", "torch_hub", "transformers"):
        raise ValueError(f"unknown loader {loader!r}; use export, torch_hub or transformers.")
    if backend == "remote_code" and loader != "transformers":
        raise ValueError(
            f"RADIOTeacher: backend: remote_code applies to loader: transformers (loader "
            f"{loader!r} {'always runs NVlabs code' if loader == 'torch_hub' else 'runs none'})"
            "; leave backend unset."
        )


def load_radio(
    model: str,
    loader: str,
    backend: str,
    adaptors: Sequence[str],
    hub_repo: str,
    trust_remote_code: bool,
) -> tuple[nn.Module, int, int]:
    """``(model, patch size, preferred resolution)`` from ``loader`` and ``backend``; NVlabs'
    code builds the ``adaptors`` named (none: the backbone only)."""
    if loader == "transformers" and backend == "native":
        return _native(model)
    if loader == "export":
        file = require_file(model, "RADIOTeacher export", "Write one with radio-lit export.")
        from radio_lit.export.files import load  # the file format lives with the export

        net = load(file)
        preferred = net.config["radio_lit"].get("preferred_resolution") or [256, 256]
        return net, net.patch_size, int(preferred[0])
    if not trust_remote_code:
        where = hub_repo if loader == "torch_hub" else model
        raise ValueError(
            f"RADIOTeacher: loading {model!r} with {loader} runs the Python code of {where!r}; "
            "set trust_remote_code: true to allow it (or use a radio-lit export file, or "
            "loader: transformers with backend: native for the backbone)."
        )
    with _einops_named(loader):
        return _nvlabs_code(model, loader, hub_repo, adaptors)


@contextmanager
def _einops_named(loader: str) -> Iterator[None]:
    """NVlabs/RADIO's code imports ``einops`` (``radio/adaptor_*.py``), which radio-lit does
    not need: its absence, met while that code loads, is one line naming the install."""
    try:
        yield
    except ImportError as error:  # transformers' remote-code check names it in its message
        if error.name != "einops" and "einops" not in str(error):
            raise
        raise ImportError(
            f"RADIOTeacher: NVlabs/RADIO's code that loader: {loader} runs imports einops, "
            "which is not installed: pip install einops"
        ) from error


def _nvlabs_code(
    model: str, loader: str, hub_repo: str, adaptors: Sequence[str]
) -> tuple[nn.Module, int, int]:
    """NVlabs' ``radio_model`` by torch.hub, or transformers' remote code:
    ``(model, patch size, preferred resolution)``."""
    if loader == "torch_hub":
        local = os.path.isdir(os.path.expanduser(hub_repo))
        with download_errors("RADIOTeacher", model, _HUB_HINT):
            net = torch.hub.load(
                os.path.expanduser(hub_repo) if local else hub_repo,
                "radio_model",
                source="local" if local else "github",
                version=model,
                adaptor_names=list(adaptors) or None,
                trust_repo=True,
            )
    else:
        from transformers import AutoConfig, AutoModel

        with download_errors("RADIOTeacher", model, _HUB_HINT):
            # NVlabs/RADIO README: set adaptor_names on the config, then load with it
            config = AutoConfig.from_pretrained(model, trust_remote_code=True)
            config.adaptor_names = list(adaptors) or None
            net = AutoModel.from_pretrained(model, config=config, trust_remote_code=True)
    inner = getattr(net, "radio_model", net)  # the HF wrapper holds the hub model
    patch = int(getattr(inner, "patch_size", 16))
    preferred = getattr(inner, "preferred_resolution", None)
    side = int(preferred[0]) if preferred is not None else 432
    return net, patch, side


def _native(model: str) -> tuple[nn.Module, int, int]:
    """transformers' own ``RadioModel`` of an NVlabs-layout Hugging Face id or folder:
    ``(model, patch size, preferred resolution)``; runs no repository code."""
    import transformers

    if not hasattr(transformers, "RadioModel"):
        raise ImportError(
            f"RADIOTeacher: transformers {transformers.__version__} has no native RadioModel "
            "(5.24 has it): upgrade transformers, or set backend: remote_code with "
            "trust_remote_code: true."
        )
    from transformers import RadioModel

    with download_errors("RADIOTeacher", model, _NATIVE_HINT):
        net, info = RadioModel.from_pretrained(model, output_loading_info=True)
    missing = sorted(info["missing_keys"]) + [str(k) for k in info.get("mismatched_keys", [])]
    if missing:
        raise ValueError(
            f"RADIOTeacher: {model!r} is not in NVlabs' C-RADIO layout that transformers' "
            f"RadioModel reads (missing or mismatched weights {missing[:3]}); for a radio-lit "
            "export use loader: export, for other NVlabs models backend: remote_code."
        )
    config = net.config
    ours = getattr(config, "radio_lit", None) or {}  # radio-lit export --format timm
    preferred = getattr(config, "preferred_resolution", None) or ours.get("preferred_resolution")
    return net, int(config.patch_size), int(preferred[0]) if preferred else 432


_NATIVE_HINT = (
    "Offline: download the repository once (hf download <id>) and give its folder as model, "
    "or use a radio-lit export file with loader: export."
)
_HUB_HINT = (
    "Offline: clone NVlabs/RADIO and give its directory as hub_repo with a downloaded "
    "checkpoint file as model, or use a radio-lit export file with loader: export."
)
