"""Teachers' speed options (``speed:``, radio_lit.teachers.speed): ``torch.compile`` with
static shapes gives the eager outputs and never recompiles once warm; FP8 is refused where it
cannot run and bounded where it can; the attention of every family goes through SDPA, on the
backend asked for or refused in one line."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.nn import functional as F
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

from radio_lit.core.errors import ConfigError
from radio_lit.teachers import SAM2Teacher
from radio_lit.teachers import speed as speed_module
from radio_lit.teachers.speed import SDPACalls, TeacherSpeed, attention_backend
from radio_lit.training.partitions import Partition
from tests.builders import cpu_trainer, tiny_module
from tests.teachers.conftest import TINY_BUILDERS
from tests.teachers.tiny import (
    TINY_SAM2_CONFIG,
    tiny_clip_teacher,
    tiny_dinov2_teacher,
    tiny_hf_dinov2_teacher,
    tiny_sam_teacher,
)

#: SDPA calls per forward of each tiny teacher, from its config (tests/teachers/tiny.py):
#: one per transformer block, plus the attention pool of timm's SigLIP trunk (test_vit3:
#: 9 blocks + MAP). transformers' SigLIP pools by nn.MultiheadAttention with weights
#: (a hand-written softmax, not SDPA): only its 2 blocks count.
SDPA_CALLS = {
    "clip": 2,
    "siglip": 10,
    "dinov2_timm": 2,
    "dinov2_hf": 2,
    "sam": 2,
    "dinov3_timm": 2,
    "siglip_hf": 2,
    "sam2_hf": 5,  # Hiera: 1 + 1 + 2 + 1 blocks, all run (stage 2's output is taken)
    "sam3_hf": 2,
}
FAMILIES = {
    **TINY_BUILDERS,
    "sam2_hf": lambda: SAM2Teacher(
        "sam2_vision_model", pretrained=False, model_kwargs=TINY_SAM2_CONFIG, resolution=64
    ),
}


def _crop(batch: int = 2) -> torch.Tensor:
    return torch.rand(batch, 3, 70, 90, generator=torch.Generator().manual_seed(0))


# -- torch.compile ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        tiny_dinov2_teacher,  # timm
        tiny_clip_teacher,  # open_clip, nn.MultiheadAttention
        lambda **kw: tiny_sam_teacher(resolution=64, mosaic=True, **kw),  # mosaics
    ],
    ids=["dinov2_timm", "clip", "sam_mosaic"],
)
def test_a_compiled_teacher_gives_the_eager_outputs(build):
    """AOT autograd without code generation (what dynamo captures, checked on CPU in
    seconds): summary and features equal to the eager teacher's, twice (compiled, then
    replayed)."""
    torch.manual_seed(0)
    eager = build()
    torch.manual_seed(0)
    compiled = build(speed=TeacherSpeed(compile={"backend": "aot_eager"}))
    crop = _crop(4)
    for _ in range(2):
        want, got = eager(crop), compiled(crop)
        torch.testing.assert_close(got.features, want.features)
        if want.summary is not None:
            torch.testing.assert_close(got.summary, want.summary)
    stats = compiled.speed_runner.compiled.stats
    assert (stats.graphs, stats.recompiles, len(stats.shapes)) == (1, 0, 1)


@pytest.mark.slow
def test_no_recompiles_once_every_shape_of_a_config_ran(tmp_path, caplog):
    """Two partitions, one drawing two student resolutions that a follow_student DINOv2
    follows, SAM on mosaics: each teacher compiles one graph per input shape in the first
    steps and nothing after (dynamo's counters); compile times reach the console and
    TensorBoard once per compilation."""
    torch.manual_seed(0)
    eager = {"backend": "eager", "dynamic": False}  # dynamo alone: what recompiles
    module = tiny_module(
        teachers={
            "clip": tiny_clip_teacher(speed=TeacherSpeed(compile=eager)),
            "dino": tiny_dinov2_teacher(follow_student=True, speed=TeacherSpeed(compile=eager)),
            "sam": tiny_sam_teacher(resolution=64, mosaic=True, speed=TeacherSpeed(compile=eager)),
        },
        partitions={
            "global": Partition(teachers=["clip", "dino"], batch_size=4, resolutions=[64, 96]),
            "sam": Partition(teachers=["sam"], batch_size=2),
        },
    )
    images = torch.randint(0, 256, (60, 3, 96, 96), dtype=torch.uint8)
    loader = torch.utils.data.DataLoader(images, batch_size=6)
    logger = TensorBoardLogger(tmp_path, name="run", version=0)
    caplog.set_level(logging.INFO, logger="lightning.pytorch")  # rank_zero_info's
    trainer = cpu_trainer(tmp_path, max_steps=6, logger=logger, log_every_n_steps=1)
    trainer.fit(module, loader)
    runners = {n: t.speed_runner for n, t in module.teachers.items()}
    warm = {n: (r.compiled.stats.frames, len(r.compiled.stats.shapes)) for n, r in runners.items()}
    assert warm["dino"][1] == 2, "both student resolutions were drawn in the warm-up"
    assert warm["clip"][1] == warm["sam"][1] == 1

    trainer = cpu_trainer(tmp_path, max_steps=10, logger=logger, log_every_n_steps=1)
    trainer.fit(module, loader)  # a second fit: more steps, the same shapes
    for name, runner in runners.items():
        stats = runner.compiled.stats
        assert (stats.frames, len(stats.shapes)) == warm[name], name  # nothing compiled
        assert stats.recompiles == 0
        assert stats.graphs == len(stats.shapes), f"{name}: one static graph per shape"

    lines = [r.getMessage() for r in caplog.records if "compiled" in r.getMessage()]
    assert any(line.startswith("teacher dino: compiled 2 graph(s)") for line in lines), lines
    events = EventAccumulator(str(tmp_path / "run" / "version_0"))
    events.Reload()
    graphs = events.Scalars("compile/dino/graphs")
    assert [e.value for e in graphs][-1] == 2
    assert len(graphs) <= 2, "logged when it compiled, not every step"
    assert "compile/sam/seconds" in events.Tags()["scalars"]


def test_teachers_refuse_torch_compile_arguments_it_does_not_take():
    with pytest.raises(ConfigError, match="speed.compile: .*'fullgraf'"):
        tiny_dinov2_teacher(speed=TeacherSpeed(compile={"fullgraf": True}))
    with pytest.raises(ConfigError, match="unknown mode 'fast'"):
        tiny_dinov2_teacher(speed=TeacherSpeed(compile={"mode": "fast"}))


def test_a_teachers_own_compile_false_keeps_it_eager_under_model_compile():
    teacher = tiny_dinov2_teacher(speed=TeacherSpeed(compile=False))
    teacher.compile(backend="eager")
    assert teacher.speed_runner.compiled is None
    plain = tiny_dinov2_teacher()
    plain.compile(backend="eager")
    assert plain.speed_runner.compiled.kwargs == {"backend": "eager", "dynamic": False}


# -- FP8 -------------------------------------------------------------------------------------


def test_fp8_is_refused_without_a_capable_gpu(monkeypatch):
    """The GPU check is reached with or without torchao installed (torchao's presence faked)."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "torchao" else find_spec(name, *a),
    )
    if speed_module.fp8_refusal() is None:
        pytest.skip("this machine runs FP8 teachers")
    with pytest.raises(ConfigError, match=r"speed\.fp8: .*(GPU|compute capability)"):
        tiny_dinov2_teacher(dtype="bfloat16", speed=TeacherSpeed(fp8="rowwise"))


def test_fp8_is_refused_without_torchao(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "torchao", None)  # find_spec: not found
    with pytest.raises(ConfigError, match=r"needs torchao: pip install 'radio-lit\[fp8\]'"):
        tiny_dinov2_teacher(dtype="bfloat16", speed=TeacherSpeed(fp8="rowwise"))


@pytest.fixture
def fp8_on_cpu(monkeypatch):
    """FP8 through torchao's own code on the CPU: its hardware gate and ours opened (torchao
    emulates ``_scaled_mm``'s arithmetic on the CPU: e4m3 values, fp32 scales)."""
    pytest.importorskip("torchao")
    import torchao.quantization.quant_api as quant_api

    monkeypatch.setattr(speed_module, "fp8_refusal", lambda device=None: None)
    monkeypatch.setattr(quant_api, "_check_hardware_support", lambda granularity: None)


def test_fp8_needs_a_bfloat16_teacher(fp8_on_cpu):
    with pytest.raises(ConfigError, match="give dtype: bfloat16"):
        tiny_dinov2_teacher(speed=TeacherSpeed(fp8="rowwise"))


@pytest.mark.parametrize("scaling", ["rowwise", "tensorwise"])
def test_fp8_quantizes_every_eligible_linear_with_bounded_outputs(fp8_on_cpu, scaling):
    """Every eligible nn.Linear holds float8 weights (sizes multiples of 16; not
    nn.MultiheadAttention's out_proj, which torchao's float8 weight cannot serve); the features
    and summary stay within FP8's error of the bfloat16 teacher's (cosine >= 0.99). (open_clip
    CLIP: no layer scale, so every block's matmuls reach the outputs; DINOv2's 1e-5 initial
    layer scale would hide them in a random-weight model.)"""
    from torchao.quantization import Float8Tensor

    torch.manual_seed(0)
    reference = tiny_clip_teacher(dtype="bfloat16")
    torch.manual_seed(0)
    teacher = tiny_clip_teacher(dtype="bfloat16", speed=TeacherSpeed(fp8=scaling))
    linears = [m for m in teacher.model.modules() if isinstance(m, torch.nn.Linear)]
    fp8 = [m for m in linears if isinstance(m.weight, Float8Tensor)]
    sized = [m for m in linears if m.in_features % 16 == 0 and m.out_features % 16 == 0]
    eligible = [m for m in sized if not isinstance(m, NonDynamicallyQuantizableLinear)]
    assert teacher.speed_runner.fp8_layers == (len(fp8), len(linears))
    assert fp8 == eligible and len(fp8) == 4 and len(sized) == 6  # c_fc, c_proj x 2 blocks
    crop = _crop(4)
    want, got = reference(crop), teacher(crop)
    assert not torch.equal(got.features, want.features)  # FP8 did run
    for a, b in ((got.features, want.features), (got.summary, want.summary)):
        assert F.cosine_similarity(a.flatten(1), b.flatten(1)).min() >= 0.99


@pytest.mark.gpu
def test_fp8_targets_stay_close_to_bfloat16_on_a_capable_gpu():
    """On an FP8-capable GPU, a ViT-B/16 (random weights) in FP8 gives features and summary
    with cosine >= 0.99 and relative error <= 0.15 against its bfloat16 self on the shipped
    photographs (benchmarks/teacher_options.py reports the real teachers)."""
    if speed_module.fp8_refusal() is not None:
        pytest.skip(f"FP8 teachers cannot run here: {speed_module.fp8_refusal()}")
    from benchmarks.teacher_options import fidelity, sample_crops
    from radio_lit.teachers import TimmTeacher

    crops = sample_crops(224, count=8).cuda()
    outputs = {}
    for fp8 in (None, "rowwise"):
        torch.manual_seed(0)
        teacher = TimmTeacher(
            "vit_base_patch16_224", pretrained=False, dtype="bfloat16", speed=TeacherSpeed(fp8=fp8)
        ).cuda()
        outputs[fp8] = teacher(crops)
    for part in ("features", "summary"):
        cosine, relative = fidelity(getattr(outputs["rowwise"], part), getattr(outputs[None], part))
        assert cosine >= 0.99 and relative <= 0.15, (part, cosine, relative)


# -- attention through SDPA ------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_attends_through_sdpa(family):
    """Every transformer block of each family calls F.scaled_dot_product_attention (so a
    backend chosen with speed.attention reaches it), the math backend giving the default
    backend's outputs."""
    torch.manual_seed(0)
    teacher = FAMILIES[family]()
    crop = _crop()
    want = teacher(crop)
    with attention_backend("math"), SDPACalls() as calls:
        got = teacher(crop)
    assert calls.count == SDPA_CALLS[family]
    torch.testing.assert_close(got.features, want.features, rtol=1e-4, atol=1e-5)


def test_the_attention_option_runs_every_call_on_its_backend():
    """speed.attention: the first call is checked, every call goes through the backend's
    kernel (the CPU flash kernel here, by aten op), and nn.MultiheadAttention's fast path is
    off only inside the teacher."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Kernels(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    teacher = tiny_clip_teacher(speed=TeacherSpeed(attention="flash"))
    for _ in range(2):
        with Kernels() as kernels:
            teacher(_crop())
        flash = [n for n in kernels.names if "flash_attention" in n]
        assert len(flash) == SDPA_CALLS["clip"], kernels.names
        assert not any("native_multi_head_attention" in n for n in kernels.names)
    assert torch.backends.mha.get_fastpath_enabled()


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_a_backend_the_device_cannot_run_is_refused(backend):
    teacher = tiny_hf_dinov2_teacher(speed=TeacherSpeed(attention=backend))
    with pytest.raises(ConfigError) as refused:
        teacher(_crop())
    message = str(refused.value)
    assert f"speed.attention {backend!r} cannot run this teacher's attention on cpu" in message
    assert "backends that run it here: flash, math" in message  # the CPU's two
    assert "\n" not in message


def test_a_teacher_that_never_calls_sdpa_is_refused_an_attention_backend():
    teacher = tiny_dinov2_teacher(speed=TeacherSpeed(attention="flash"))
    for block in teacher.model.blocks:
        block.attn.fused_attn = False  # timm's hand-written attention (TIMM_FUSED_ATTN=0)
    with pytest.raises(ConfigError, match="never calls F.scaled_dot_product_attention"):
        teacher(_crop())
