"""A frozen teacher's speed options, chosen per teacher in YAML (``speed:`` of a teacher):
``torch.compile`` of its encoder with static shapes, FP8 linear layers (torchao) on GPUs of
compute capability 8.9 or higher, and the SDPA backend of its attention.

Each acts on the teacher's own encoder call (:meth:`radio_lit.teachers.Teacher.run_encoder`,
between the view and the cast of its outputs), never on the training step around it, so a
teacher behaves the same in ``radio-lit fit``, ``radio-lit cache`` and the benchmarks:

- ``compile``: ``torch.compile`` of ``encode`` (:class:`radio_lit.core.compiling.CompiledCall`):
  static shapes, one graph per input shape (a partition's batch and a resolution), compiled at
  its first call and never again; ``reduce-overhead`` / ``max-autotune`` add CUDA graphs,
  whose outputs are copied out of the graphs' memory pool before the next teacher runs.
- ``fp8``: torchao's ``Float8DynamicActivationFloat8WeightConfig`` on every ``nn.Linear`` of
  the encoder whose sizes FP8 matmuls take (multiples of 16): float8 e4m3 weights, activations
  quantized on the fly, row-wise or tensor-wise scales. Refused, never skipped, without
  torchao or a capable GPU.
- ``attention``: every ``F.scaled_dot_product_attention`` of the encoder runs on one SDPA
  backend (``torch.nn.attention.sdpa_kernel``); ``nn.MultiheadAttention`` (open_clip's
  OpenAI-style towers) then takes its Python path, which calls SDPA, instead of its fused
  fast path, which would ignore a backend it cannot use. The first call checks that the
  encoder reaches SDPA and that the backend runs there, and refuses in one line otherwise.

Trade-offs and which teachers qualify: docs/speed.md. [choice]
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear
from torch.overrides import TorchFunctionMode

from radio_lit.core.compiling import CompiledCall, CompileOption
from radio_lit.core.errors import ConfigError

#: SDPA backends a teacher may ask for, by their YAML names.
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
AttentionBackend = Literal["flash", "cudnn", "efficient", "math"]

#: FP8 scale granularity: one scale per row of weights and activations, or per tensor.
FP8Scaling = Literal["rowwise", "tensorwise"]

#: The compute capability FP8 matmuls (``torch._scaled_mm``) need: Ada, Hopper, Blackwell.
FP8_CAPABILITY = (8, 9)

_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TeacherSpeed:
    """Speed options of one teacher (its ``speed:`` in YAML); all off by default.

    Attributes:
        compile: ``torch.compile`` of the teacher's encoder with static shapes: ``true``
            (inductor's defaults) or ``torch.compile``'s keyword arguments (``{mode:
            max-autotune}``...); ``false``: never compiled, even under ``model.compile``;
            ``None``: as ``model.compile`` says.
        fp8: FP8 linear layers with ``rowwise`` or ``tensorwise`` scales (torchao; a
            ``dtype: bfloat16`` teacher on a GPU of compute capability 8.9+); ``None``: off.
        attention: the SDPA backend of every attention call: ``flash``, ``cudnn``,
            ``efficient`` or ``math``; ``None``: torch picks per call.
    """

    compile: CompileOption | None = None
    fp8: FP8Scaling | None = None
    attention: AttentionBackend | None = None


def fp8_refusal(device: torch.device | None = None) -> str | None:
    """Why FP8 teachers cannot run here (on ``device``; default the current CUDA device), or
    ``None`` where they can: torchao installed and an NVIDIA GPU of compute capability 8.9+."""
    if importlib.util.find_spec("torchao") is None:
        return "it needs torchao: pip install 'radio-lit[fp8]'"
    if device is not None and device.type != "cuda":
        return f"the teacher runs on {device.type}, and FP8 matmuls need a CUDA GPU"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible, and FP8 matmuls need one of compute capability 8.9+"
    index = device.index if device is not None and device.index is not None else None
    index = torch.cuda.current_device() if index is None else index
    capability = torch.cuda.get_device_capability(index)
    if capability < FP8_CAPABILITY:
        major, minor = capability
        return (
            f"{torch.cuda.get_device_name(index)} has compute capability {major}.{minor}; FP8 "
            "matmuls need 8.9 or higher (Ada, Hopper, Blackwell)"
        )
    return None


def fp8_eligible(module: nn.Module) -> bool:
    """Whether :func:`quantize_fp8` converts ``module``: an ``nn.Linear`` whose in and out
    features are multiples of 16 (what ``torch._scaled_mm`` takes), except
    ``nn.MultiheadAttention``'s output projection (``NonDynamicallyQuantizableLinear``),
    whose weight ``F.multi_head_attention_forward`` multiplies outside ``nn.Linear`` (a
    float8 weight fails there, in torchao's dispatch)."""
    return (
        isinstance(module, nn.Linear)
        and not isinstance(module, NonDynamicallyQuantizableLinear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def quantize_fp8(model: nn.Module, scaling: FP8Scaling) -> tuple[int, int]:
    """FP8 weights (float8 e4m3, ``scaling`` scales) and on-the-fly FP8 activations for every
    :func:`fp8_eligible` layer of ``model``, in place (torchao's ``quantize_``). Returns
    ``(fp8 layers, nn.Linear layers)``; the others keep their dtype.

    torchao's ``set_inductor_config`` stays off: it would change process-wide settings
    (inductor's tuning, float32 matmul precision) that the student shares. [choice]
    """
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Float8Tensor,
        PerRow,
        PerTensor,
        quantize_,
    )

    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    eligible = {id(m) for m in linears if fp8_eligible(m)}
    granularity = PerRow() if scaling == "rowwise" else PerTensor()
    config = Float8DynamicActivationFloat8WeightConfig(
        granularity=granularity, set_inductor_config=False
    )
    quantize_(model, config, filter_fn=lambda module, _: id(module) in eligible)
    done = sum(isinstance(m.weight, Float8Tensor) for m in linears)
    if done != len(eligible):  # never a silent partial fallback
        raise RuntimeError(f"torchao quantized {done} of the {len(eligible)} eligible layers")
    return done, len(linears)


@contextmanager
def attention_backend(name: AttentionBackend | None) -> Iterator[None]:
    """Every SDPA call inside runs on backend ``name`` (or fails); ``nn.MultiheadAttention``
    takes its Python path through SDPA (its fused fast path would ignore the backend).
    ``None``: nothing changes."""
    if name is None:
        yield
        return
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel([SDPA_BACKENDS[name]]):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)


class SDPACalls(TorchFunctionMode):
    """Counts the encoder's calls of ``F.scaled_dot_product_attention`` while active (``with
    SDPACalls() as calls: ...; calls.count``).

    A mode does not see what a function it intercepted calls, so
    ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``'s Python path) counts when
    called with ``need_weights=False``: torch's implementation then makes one SDPA call
    (with weights, it multiplies and normalizes by hand)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.last: Callable[[], Any] | None = None  # the last call counted, to run again

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention or (
            func is F.multi_head_attention_forward and kwargs.get("need_weights") is False
        ):
            self.count += 1
            self.last = lambda: func(*args, **kwargs)
        return func(*args, **kwargs)


def checked_attention(label: str, encode: Callable[[Tensor], Any], view: Tensor, name: str) -> Any:
    """``encode(view)`` under :func:`attention_backend` ``name``, refused with a
    :class:`ConfigError` naming ``label`` when the encoder never calls SDPA (the option would
    do nothing) or when backend ``name`` cannot run its attention on this device (with torch's
    reasons)."""
    calls = SDPACalls()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with attention_backend(name), calls:
                out = encode(view)
        except RuntimeError as error:
            if "backend" not in str(error) and "kernel" not in str(error):
                raise
            reasons = [str(w.message).strip().splitlines()[0] for w in caught]
            reasons = [r for r in reasons if "because" in r or "support" in r or "require" in r]
            why = f" ({'; '.join(reasons[:2])})" if reasons else ""
            others = [b for b in SDPA_BACKENDS if b != name and _runs(b, calls.last)]
            raise ConfigError(
                f"{label}: speed.attention {name!r} cannot run this teacher's attention on "
                f"{view.device} in {view.dtype}{why}; backends that run it here: "
                f"{', '.join(others) or 'none'} (or leave speed.attention unset)"
            ) from error
    for warning in caught:  # what else the call said is said as usual
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if not calls.count:
        raise ConfigError(
            f"{label}: speed.attention {name!r} has nothing to act on: this teacher's encoder "
            "never calls F.scaled_dot_product_attention (docs/speed.md "
            "lists the teachers that do); leave speed.attention unset"
        )
    return out


def _runs(backend: str, call: Callable[[], Any] | None) -> bool:
    """Whether the attention call ``call`` runs on SDPA backend ``backend``."""
    if call is None:
        return False
    try:
        with torch.no_grad(), warnings.catch_warnings(), attention_backend(backend):
            warnings.simplefilter("ignore")
            call()
    except RuntimeError:
        return False
    return True


def check_compile_option(option: CompileOption | None) -> None:
    """:class:`ConfigError` for ``torch.compile`` keyword arguments it would refuse at the
    first call (an unknown name or mode), before anything runs."""
    if not isinstance(option, dict):
        return
    try:
        inspect.signature(torch.compile).bind(None, **option)
    except TypeError as error:
        raise ConfigError(f"speed.compile: {error} (torch.compile's keyword arguments)") from None
    mode = option.get("mode")
    if mode is not None and mode not in _COMPILE_MODES:
        raise ConfigError(f"speed.compile: unknown mode {mode!r}; use one of {_COMPILE_MODES}")


class EncoderRunner:
    """How a teacher's ``encode`` is called with its :class:`TeacherSpeed`.

    Built by :meth:`radio_lit.teachers.Teacher.freeze`, which has the weights: FP8 is applied
    there (refused at once where it cannot run), compilation at the first compiled call.

    Args:
        encode: the teacher's ``encode(view) -> TeacherOutput``.
        model: the teacher's encoder (what FP8 quantizes).
        speed: the options.
        label: what messages call the teacher (its config key once :class:`SpeedReport` has
            named it).
    """

    def __init__(
        self, encode: Callable[[Tensor], Any], model: nn.Module, speed: TeacherSpeed, label: str
    ) -> None:
        if speed.attention is not None and speed.attention not in SDPA_BACKENDS:
            raise ConfigError(
                f"speed.attention: unknown backend {speed.attention!r}; use one of "
                f"{list(SDPA_BACKENDS)}"
            )
        check_compile_option(speed.compile)
        self.encode = encode
        self.speed = speed
        self.compiled: CompiledCall | None = None
        self.fp8_layers: tuple[int, int] | None = None
        self._label = label
        self._first_call = True
        if speed.fp8 is not None:
            self.fp8_layers = _fp8(model, speed.fp8)
        if speed.compile not in (None, False):
            self.compile(speed.compile)

    @property
    def label(self) -> str:
        return self._label

    @label.setter
    def label(self, value: str) -> None:
        self._label = value
        if self.compiled is not None:
            self.compiled.name = value

    def compile(self, option: CompileOption) -> None:
        """Compile ``encode`` with static shapes (``torch.compile`` arguments ``option``); the
        same option again (a second ``fit``'s ``configure_model``) keeps what was compiled."""
        compiled = CompiledCall(self.encode, option, self._label)
        if self.compiled is None or self.compiled.kwargs != compiled.kwargs:
            self.compiled = compiled

    def __call__(self, view: Tensor) -> Any:
        """``encode(view)`` with the options (``view [B, 3, H, W]`` in the teacher's dtype)."""
        if self._first_call:
            self._first_call = False
            if self.speed.fp8 is not None and (reason := fp8_refusal(view.device)):
                raise ConfigError(f"{self._label}: speed.fp8: {reason}")
            if self.speed.attention is not None:  # eager, checked; compiled from the next
                return checked_attention(self._label, self.encode, view, self.speed.attention)
        call = self.compiled or self.encode
        with attention_backend(self.speed.attention):
            out = call(view)
        if self.compiled is not None and self.compiled.cuda_graphs:
            # the graphs' pool is reused by the next replay: the outputs leave it now
            out = dataclasses.replace(
                out,
                features=out.features.clone(),
                summary=None if out.summary is None else out.summary.clone(),
            )
        return out


def _fp8(model: nn.Module, scaling: FP8Scaling) -> tuple[int, int]:
    """:func:`quantize_fp8` on a ``bfloat16`` encoder, refused in one line where it cannot
    run."""
    reason = fp8_refusal()
    if reason is not None:
        raise ConfigError(f"speed.fp8: {reason}; leave speed.fp8 unset to run in bfloat16")
    dtype = next(model.parameters()).dtype
    if dtype != torch.bfloat16:
        raise ConfigError(
            f"speed.fp8 replaces a bfloat16 teacher's matmuls, this one holds {dtype}: give "
            "dtype: bfloat16"
        )
    return quantize_fp8(model, scaling)


class SpeedReport(Callback):
    """Reports the teachers' speed options once each (added by ``DistillationModule``).

    At setup it names each teacher's runner by its config key (``model.teachers.<name>``, for
    messages) and prints its FP8 layer count. After every batch it prints, and logs to the
    trainer's loggers, what compiling a teacher cost when it compiled: ``compile/<name>/
    seconds`` (wall-clock of the calls that compiled), ``compile/<name>/graphs`` and
    ``compile/<name>/recompiles`` (compilations for an input already compiled: 0 in steady
    state).
    """

    def __init__(self) -> None:
        self.runners: dict[str, EncoderRunner] = {}

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        teachers = getattr(pl_module, "teachers", {})
        self.runners = {
            n: t.speed_runner for n, t in teachers.items() if getattr(t, "speed_runner", None)
        }
        for name, runner in self.runners.items():
            runner.label = f"model.teachers.{name}"
            if runner.fp8_layers is not None:
                done, total = runner.fp8_layers
                rank_zero_info(
                    f"teacher {name}: FP8 ({runner.speed.fp8}) in {done} of its {total} linear "
                    "layers (the others keep bfloat16: sizes not multiples of 16, or "
                    "nn.MultiheadAttention's output projection)"
                )

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self._report(trainer)

    def on_validation_batch_end(self, trainer: Trainer, *args: Any) -> None:
        self._report(trainer)

    def _report(self, trainer: Trainer) -> None:
        metrics: dict[str, float] = {}
        for name, runner in self.runners.items():
            stats = None if runner.compiled is None else runner.compiled.stats
            if stats is None or stats.graphs == stats.reported:
                continue
            stats.reported = stats.graphs
            shapes = ", ".join("x".join(map(str, shape)) for shape, *_ in stats.shapes)
            rank_zero_info(
                f"teacher {name}: compiled {stats.graphs} graph(s) for input(s) {shapes} in "
                f"{stats.seconds:.1f} s ({stats.recompiles} recompiles after warm-up)"
            )
            metrics[f"compile/{name}/seconds"] = stats.seconds
            metrics[f"compile/{name}/graphs"] = float(stats.graphs)
            metrics[f"compile/{name}/recompiles"] = float(stats.recompiles)
        if metrics and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
