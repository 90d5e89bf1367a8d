"""A start built by NVIDIA's own code, carried through the adapt twin, read back by NVIDIA's
loader (by hand; not a test: it runs NVlabs/RADIO's code, which needs ``einops``).

For each variant of :data:`VARIANTS` (plain, σReparam, LayerScale, an NVlabs-only model name,
a feature normalizer), NVlabs/RADIO's code builds a small RADIO from ``args`` with random
weights (``radio.radio_model.create_model_from_args``; σReparam by
``radio.enable_spectral_reparam.configure_spectral_reparam_from_args``; each adaptor's MLPs by
its ``GenericAdaptor`` from a config; ``radio.feature_normalizer.FeatureNormalizer``), with
ImageNet's pixel mean and std (neither NVlabs' CLIP default nor the student class's), and
saves it as NVIDIA's checkpoints are read by ``hubconf.radio_model``: ``{"args", "state_dict"}``
with ``base_model.*``, ``input_conditioner.*``, ``_heads.<name>.*``,
``_feature_projections.<name>.*`` and ``_feature_normalizer.*``. Its adaptors: ``clip`` of
NVlabs' ``open_clip`` type (a tiny open_clip model from a local file, so that NVIDIA's loader
attaches a text encoder offline), ``dino`` (generic), ``sam`` (generic, no summary) and
``siglip2-g`` of NVlabs' ``siglip2`` type (which the twin has no teacher for: carried into
the export; NVIDIA's loader would download its text model, so it is not asked for it).

Then, as a user would (``radio-lit`` through :class:`~radio_lit.cli.app.RadioLitCLI`):

1. ``configs/recipes/adapt/quickstart.yaml`` with the file as ``model.init_from``, the student
   ``radio_lit.export.PublishedStudent`` of it, its four RADIO teachers reading it with
   NVIDIA's code (``loader: torch_hub``, the checkout as ``hub_repo``): at step 0 (eval mode)
   the student's and heads' outputs against NVIDIA's loader of the file;
2. stage 1: ``LR`` for ``STEPS`` steps (PHI-S estimated and refitted: the imported heads
   composed with each refit);
3. stage 2 from stage 1's ``last.ckpt``, ``STEPS`` more steps;
4. ``radio-lit export <stage 2's last.ckpt> --format radio``;
5. NVIDIA's loader reads the export with ``clip``, ``dino`` and ``sam``: its conditioner against
   the source's, each output against NVIDIA's loader of the source, ``clip``'s ``encode_text``,
   and the export's ``siglip2-g`` entry (type and model) against the source's.

    PYTHONPATH=. python benchmarks/nvlabs_built.py <NVlabs/RADIO checkout> <folder> [variant...]
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

SIZE = {"depth": 2, "embed_dim": 64, "num_heads": 2}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's
CPE_MAX = 256
STEPS, LR = 3, 1e-6  # tiny-lr steps, which the twin's TrainingProgressGuard sees move [choice]
#: name -> (args.model, spectral_reparam, feature normalizer). ``vit_base_patch16_v2_224`` and
#: ``vit_huge_patch16_224`` are registered by NVlabs' ``radio/extra_timm_models.py``, not by timm;
#: the ``v2`` one has LayerScale (``init_values=1e-5``), which NVlabs' ``_patch_layer_scale``
#: saves as ``ls<k>.grandma``.
VARIANTS = {
    "plain": ("vit_base_patch16_224", False, False),
    "spectral-reparam": ("vit_base_patch16_224", True, False),
    "layer-scale": ("vit_base_patch16_v2_224", False, False),
    "nvlabs-name": ("vit_huge_patch16_224", False, False),
    "feature-normalizer": ("vit_base_patch16_224", False, True),
}
TWIN = "configs/recipes/adapt/quickstart.yaml"
RUN_HEADS = ("clip", "dino", "sam")


def tiny_open_clip(root: Path) -> tuple[str, str]:
    """A tiny open_clip model registered under the tests' name, its random weights in a file:
    ``(model, pretrained)`` for NVlabs' ``open_clip`` adaptor (``create_model_from_pretrained``
    with a local file)."""
    import open_clip

    from tests.teachers.tiny import TINY_CLIP_CFG

    folder = root / "open_clip"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "radio-lit-tiny-clip.json").write_text(json.dumps(TINY_CLIP_CFG))
    open_clip.add_model_config(folder)
    weights = folder / "radio-lit-tiny-clip.pt"
    if not weights.is_file():
        torch.save(open_clip.create_model("radio-lit-tiny-clip").state_dict(), weights)
    return "radio-lit-tiny-clip", str(weights)


def build_nvlabs(name: str, root: Path, clip: tuple[str, str]) -> Path:
    """Variant ``name`` built and saved by NVlabs' own code (see the module docstring)."""
    from radio.adaptor_generic import GenericAdaptor
    from radio.enable_spectral_reparam import configure_spectral_reparam_from_args
    from radio.feature_normalizer import FeatureNormalizer
    from radio.input_conditioner import InputConditioner
    from radio.radio_model import create_model_from_args

    model, spectral, normalizer = VARIANTS[name]
    torch.manual_seed(0)
    teachers = [
        {"name": "clip", "type": "open_clip", "model": clip[0], "pretrained": clip[1],
         "use_summary": True},
        {"name": "dino", "type": "dino", "use_summary": True},
        {"name": "sam", "type": "sam", "use_summary": False},
        {"name": "siglip2-g", "type": "siglip2", "model": "siglip2-g-384", "use_summary": True},
    ]  # fmt: skip
    args = Namespace(
        model=model, model_kwargs=dict(SIZE), pretrained=False, in_chans=None,
        input_size=[3, 224, 224], num_classes=0, drop=0.0, drop_path=None, drop_block=None,
        gp=None, bn_momentum=None, bn_eps=None, torchscript=False, initial_checkpoint="",
        model_norm=False, cpe_max_size=CPE_MAX, teachers=teachers, cls_token_per_teacher=True,
        register_multiple=None, cpe_num_registers=3, spectral_reparam=spectral,
        spectral_heads=False, mlp_version="v2", spatial_mlp_version="v2", dtype=torch.float32,
    )  # fmt: skip
    trunk = create_model_from_args(args)
    with torch.no_grad():  # random weights of a trained model's scale [choice]
        for key, value in trunk.named_parameters():
            if key.endswith(("grandma", "gamma")):
                value.uniform_(0.5, 1.5)
            elif "norm" not in key:
                value.normal_(0, 0.3 if value.ndim > 1 else 0.1)
    if spectral:
        configure_spectral_reparam_from_args(trunk, args)
    state = {f"base_model.{k}": v for k, v in trunk.state_dict().items()}
    conditioner = InputConditioner(1.0, MEAN, STD)
    state.update({f"input_conditioner.{k}": v for k, v in conditioner.state_dict().items()})
    dim = SIZE["embed_dim"]
    widths = {"clip": (32, 48), "dino": (40, 40), "sam": (24, 24), "siglip2-g": (36, 36)}
    for teacher in teachers:
        summary, features = widths[teacher["name"]]
        config = {
            "summary": {"input_dim": dim, "hidden_dim": 96, "output_dim": summary, "num_inner": 0},
            "feature": {"input_dim": dim, "hidden_dim": 96, "output_dim": features,
                        "num_inner": 0},
        }  # fmt: skip
        adaptor = GenericAdaptor(args, None, None, mlp_config=config)
        with torch.no_grad():
            for value in adaptor.parameters():
                value.normal_(0, 0.2)
        for part, prefix in (("head_mlp", "_heads"), ("feat_mlp", "_feature_projections")):
            for k, v in getattr(adaptor, part).state_dict().items():
                state[f"{prefix}.{teacher['name']}.{k}"] = v
    if normalizer:
        features = FeatureNormalizer(dim)
        features.mean.normal_()
        features.tx.copy_(torch.linalg.qr(torch.randn(dim, dim))[0] * 0.8)
        state.update({f"_feature_normalizer.{k}": v for k, v in features.state_dict().items()})
    path = root / name / f"{name}.pth.tar"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"args": args, "state_dict": state}, path)
    return path


def nvidia(repo: str, path: Path, adaptors: list[str]) -> tuple[Any, list[str]]:
    """NVIDIA's ``hubconf.radio_model`` of ``path``, and its warnings about keys."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = torch.hub.load(repo, "radio_model", source="local", version=str(path),
                               adaptor_names=adaptors).eval()  # fmt: skip
    return model, [str(w.message) for w in caught if "keys" in str(w.message)]


def twin_overrides(repo: str, source: Path, start: Path, root: Path, version: str) -> list[str]:
    """``radio-lit fit --config configs/recipes/adapt/quickstart.yaml`` from ``start``, its
    teachers NVIDIA's code reading ``source``."""
    out = [
        f"--model.init_from={start}",
        "--model.student=radio_lit.export.PublishedStudent",
        f"--model.student.init_args.source={source}",
        f"--model.optimizer.init_args.lr={LR}",
        f"--trainer.max_steps={STEPS}",
        f"--trainer.logger.init_args.save_dir={root}",
        f"--trainer.logger.init_args.version={version}",
        "--trainer.enable_progress_bar=false",
        "--data.init_args.val_dir=null",
        # the backbone's own entry without summary, as the real-size recipe's c-radio: the
        # file's summary tokens are its teachers' (one per teacher), none is the backbone's
        "--model.teachers.quickstart.init_args.summary=false",
    ]
    for teacher in ("quickstart", *RUN_HEADS):
        at = f"--model.teachers.{teacher}.init_args"
        out += [f"{at}.model={source}", f"{at}.loader=torch_hub", f"{at}.hub_repo={repo}"]
        out.append(f"{at}.trust_remote_code=true")
    return out


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    got = got.reshape(want.shape)
    return float((got.double() - want.double()).norm() / want.double().norm())


def compare(got: dict, want: Any, names: list[str], images: torch.Tensor) -> dict[str, str]:
    """``{output: "summary x, features y"}``: ``got`` (``{name: (summary, features)}``) against
    NVIDIA's model ``want`` on ``images``, relative."""
    with torch.no_grad():
        reference = want(images, feature_fmt="NLC")
    out = {}
    for name in names:
        summary, features = got[name]
        ref = reference[name]
        parts = [f"features {relative(features, ref.features):.1e}"]
        if summary is not None:
            parts.insert(0, f"summary {relative(summary, ref.summary):.1e}")
        out[name] = ", ".join(parts)
    return out


def step0(cli: Any, source_model: Any, images: torch.Tensor) -> dict[str, str]:
    """The twin's student and imported heads at step 0 (eval mode, teacher space) against
    NVIDIA's loader of the source: the backbone's ``summary_idxs`` tokens, each head."""
    from radio_lit.data.views import normalize_view

    module = cli.model.eval()
    with torch.no_grad():
        student = module.student(normalize_view(images, *module.conditioner.values))
        got = {"backbone": (student.summary[:, source_model.summary_idxs].flatten(1),
                            student.features)}  # fmt: skip
        for name in RUN_HEADS:  # sam: no summary token (use_summary: false)
            heads, slot = module.heads[name], module.summary_token.get(name)
            summary = heads.summary(student.summary[:, slot]) if slot is not None else None
            got[name] = (summary, heads.features(student.features))
    module.train()
    return compare(got, source_model, ["backbone", *RUN_HEADS], images)


def fit(cli: Any) -> Path:
    """The run's ``STEPS`` steps; its ``last.ckpt`` (the twin's ``ModelCheckpoint``), which
    holds the last step."""
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    last = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == STEPS, last
    return last


def run_variant(repo: str, root: Path, name: str, clip: tuple[str, str]) -> dict[str, Any]:
    from benchmarks.harness import parse

    source = build_nvlabs(name, root, clip)
    folder = source.parent
    images = torch.rand(2, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    reference, warned = nvidia(repo, source, list(RUN_HEADS))
    result: dict[str, Any] = {"source key warnings": warned}
    cli = parse(TWIN, *twin_overrides(repo, source, source, folder, "stage1"))
    result["step 0"] = step0(cli, reference, images)
    stage1 = fit(cli)
    cli = parse(TWIN, *twin_overrides(repo, source, stage1, folder, "stage2"))
    stage2 = fit(cli)
    export = folder / "exported"
    command = [sys.executable, "-m", "radio_lit", "export", str(stage2), "--format", "radio",
               "--output", str(export)]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    exported, warned = nvidia(repo, export.with_suffix(".pth"), list(RUN_HEADS))
    result["export key warnings"] = warned
    mean = exported.input_conditioner.norm_mean.flatten().tolist()
    result["NVIDIA's conditioner of the export"] = [round(v, 5) for v in mean]
    with torch.no_grad():
        out = exported(images, feature_fmt="NLC")
    got = {n: (out[n].summary, out[n].features) for n in ["backbone", *RUN_HEADS]}
    got["sam"] = (None, got["sam"][1])  # no summary (use_summary: false)
    result["export vs source"] = compare(got, reference, ["backbone", *RUN_HEADS], images)
    clip_adaptor = exported.adaptors["clip"]
    result["clip adaptor"] = type(clip_adaptor).__name__
    tokens = torch.arange(8)[None]  # ids of the tiny text model's vocabulary (64), context 8
    result["encode_text"] = list(clip_adaptor.encode_text(tokens).shape)
    args = torch.load(export.with_suffix(".pth"), weights_only=False)["args"]
    kept = {t["name"]: (t["type"], t.get("model")) for t in vars(args)["teachers"]}
    result["export's adaptor types"] = kept
    return result


def main(repo: str, root: Path, names: list[str]) -> None:
    sys.path.insert(0, repo)  # NVlabs' ``radio`` package, to build the sources
    root.mkdir(parents=True, exist_ok=True)
    clip = tiny_open_clip(root)
    for name in names or VARIANTS:
        result = run_variant(repo, root, name, clip)
        print(f"== {name} ({VARIANTS[name][0]})")
        for key, value in result.items():
            print(f"  {key}: {value}")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
