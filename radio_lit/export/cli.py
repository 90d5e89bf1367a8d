"""``radio-lit export``: a training checkpoint as NVlabs/RADIO's format, safetensors or ONNX.

    radio-lit export CHECKPOINT [--config FILE] [--output STEM] [--format F] [--resolution H W]

Writes, from a training checkpoint and its run's config, ``<stem>.pth`` (NVlabs/RADIO's
format: ``torch.hub.load('NVlabs/RADIO', 'radio_model', version='<stem>.pth',
adaptor_names=[...])``) and ``<stem>.safetensors`` with ``<stem>.json`` (``radio_lit.load``),
with every teacher's normalizer folded into its feature head (PHI-S A.6); ``--format onnx``
writes ``<stem>.onnx`` (:mod:`radio_lit.export.onnx`); ``--format hf`` writes the folder
``--output`` (default ``<run>/export/hf``): a Hugging Face model with its card
(:mod:`radio_lit.export.hf`), ``--heads`` choosing the adaptor heads it keeps; ``--format
timm`` writes the folder ``--output`` (default ``<run>/export/timm``) that timm's C-RADIO
classes and transformers' native ``RadioModel`` load, and prints the calls
(:mod:`radio_lit.export.timm_radio`).
"""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from radio_lit.errors import CommandParser, ConfigError, checkpoint_file
from radio_lit.export.checkpoint import checkpoint_inference_model
from radio_lit.export.files import save_radio, save_safetensors
from radio_lit.export.hf import export_hf
from radio_lit.export.onnx import save_onnx
from radio_lit.export.timm_radio import export_timm


def main(argv: list[str]) -> None:
    parser = CommandParser(
        prog="radio-lit export",
        description="Export a training checkpoint to NVlabs/RADIO's format, safetensors or ONNX.",
    )
    parser.add_argument("checkpoint", type=Path, help="a .ckpt written by radio-lit fit")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the run's config (default: config.yaml beside the checkpoints/ folder)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="output path without suffix (default: <run>/export/<checkpoint name>); the "
        "folder for --format hf or timm (default: <run>/export/hf or timm)",
    )
    parser.add_argument(
        "--format",
        choices=["both", "radio", "safetensors", "onnx", "hf", "timm"],
        default="both",
        help="which files to write: both = radio and safetensors; hf = a Hugging Face model "
        "folder with its model card; timm = the backbone as a folder that timm's C-RADIO "
        "classes (timm.create_model('naflexvit_huge_patch16_radio_v4', pretrained=True, "
        "pretrained_cfg_overlay=dict(file=...)), the exact call printed) and transformers' "
        "RadioModel load; refused, naming the fix, for a student they cannot represent (a "
        "final norm, one prefix token, ViTDet windows at inference, cpe_align_corners true, "
        "other blocks, E-RADIO) (default: both)",
    )
    parser.add_argument(
        "--heads",
        nargs="+",
        default=None,
        metavar="TEACHER",
        help="--format hf: the teachers whose adaptor heads the folder keeps (default: all)",
    )
    parser.add_argument(
        "--resolution",
        type=int,
        nargs=2,
        metavar=("H", "W"),
        default=None,
        help="ONNX example input size, the graph's fixed size where H, W cannot be dynamic "
        "(E-RADIO; default: the training resolution)",
    )
    parser.add_argument(
        "--ema",
        action="store_true",
        help="export the EMA student and heads (runs with model.mesa) instead of the raw weights",
    )
    args = parser.parse_args(argv)
    if args.format == "hf":
        folder = args.output or args.checkpoint.parent.parent / "export" / "hf"
        _check_folder(folder, "--output" if args.output is not None else "checkpoint")
        checkpoint_file(args.checkpoint, "checkpoint")
        for path in export_hf(args.checkpoint, folder, args.config, args.heads):
            print(path)
        return
    if args.format == "timm":
        folder = args.output or args.checkpoint.parent.parent / "export" / "timm"
        _check_folder(folder, "--output" if args.output is not None else "checkpoint")
        checkpoint_file(args.checkpoint, "checkpoint")
        paths, calls = export_timm(args.checkpoint, folder, args.config, args.ema)
        print("\n".join([*map(str, paths), *calls]))
        return
    stem = args.output
    if stem is None:
        stem = args.checkpoint.parent.parent / "export" / args.checkpoint.stem
    _check_folder(stem.parent, "--output" if args.output is not None else "checkpoint")
    checkpoint_file(args.checkpoint, "checkpoint")
    formats = ["radio", "safetensors"] if args.format == "both" else [args.format]
    written = []
    with tqdm(total=1 + len(formats), unit="step", desc="export", dynamic_ncols=True) as bar:
        bar.set_postfix_str("fold normalizers")
        model = checkpoint_inference_model(args.checkpoint, args.config, args.ema)
        bar.update()
        if "radio" in formats:
            bar.set_postfix_str("write .pth")
            written.append(save_radio(model, stem.with_name(stem.name + ".pth")))
            bar.update()
        if "safetensors" in formats:
            bar.set_postfix_str("write .safetensors")
            written.extend(save_safetensors(model, stem.with_name(stem.name + ".safetensors")))
            bar.update()
        if "onnx" in formats:
            bar.set_postfix_str("write .onnx")
            resolution = tuple(args.resolution) if args.resolution else None
            written.append(save_onnx(model, stem.with_name(stem.name + ".onnx"), resolution))
            bar.update()
    for path in written:
        print(path)


def _check_folder(folder: Path, option: str) -> None:
    """Refuse an output ``folder`` that cannot be made because a file stands in its way (the
    folder itself or one above it), naming that file."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise ConfigError(
                    f"radio-lit export: {option}: cannot write into {folder}: {candidate} is a "
                    "file, not a folder; give another --output (or move that file)"
                )
            return
