"""``radio-lit export``: a checkpoint to RADIO's format, safetensors, ONNX or Hugging Face.

    radio-lit export CHECKPOINT [--config FILE] [--output STEM] [--format F] [--ema]
        [--resolution H W] [--heads T ...] [--name NAME] [--overwrite]

Writes, from a training checkpoint and its run's config, ``<stem>.pth`` (NVlabs/RADIO's
format: ``torch.hub.load('NVlabs/RADIO', 'radio_model', version='<stem>.pth',
adaptor_names=[...])``) and ``<stem>.safetensors`` with ``<stem>.json`` (``radio_lit.load``),
with every teacher's normalizer folded into its feature head (PHI-S A.6); ``--format onnx``
writes ``<stem>.onnx`` and ``<stem>.onnx.data`` (:mod:`radio_lit.export.onnx`); ``--format
hf`` writes the folder ``--output``: a Hugging Face model with its card
(:mod:`radio_lit.hf.folder`), ``--heads`` choosing the adaptor heads it keeps and ``--name``
its name; ``--format timm`` writes the folder ``--output`` that timm's C-RADIO classes and
transformers' native ``RadioModel`` load, and prints the calls
(:mod:`radio_lit.export.timm_radio`). The default stem is ``<run>/export/<checkpoint name>``
(``-ema`` added with ``--ema``; ``-hf`` or ``-timm`` added for the folders). Every export
records its source (checkpoint, step, raw or EMA weights: :mod:`radio_lit.export.source`).

Nothing is overwritten unasked: an output file that exists, or a non-empty folder, is refused
in one line naming ``--overwrite`` (:func:`outputs` lists each format's files; a format it
does not list is checked by every existing ``<stem>.*``).
"""

from __future__ import annotations

import glob
from pathlib import Path

from radio_lit.core.errors import CommandParser, ConfigError, checkpoint_file
from radio_lit.export.files import refuse_overwrite, save_radio, save_safetensors
from radio_lit.export.onnx import external_data, save_onnx
from radio_lit.export.progress import stages
from radio_lit.export.source import exported_model
from radio_lit.export.timm_radio import export_timm
from radio_lit.hf.folder import export_hf

#: The files each ``--format`` writes, as suffixes of the output stem (``hf``: the folder).
FORMAT_SUFFIXES = {
    "radio": (".pth",),
    "safetensors": (".safetensors", ".json"),
    "onnx": (".onnx", ".onnx.data"),
    "hf": ("",),
    "timm": ("",),
}

#: The last suffixes of the files :data:`FORMAT_SUFFIXES` names, taken off a given ``--output``.
_FILE_SUFFIXES = {s for written in FORMAT_SUFFIXES.values() for s in written if s.count(".") == 1}


def outputs(fmt: str, stem: Path) -> list[Path]:
    """The paths ``--format fmt`` writes for the output ``stem``; for a format missing from
    :data:`FORMAT_SUFFIXES`, whatever already bears the stem's name (``<stem>``, ``<stem>.*``)."""
    if fmt in FORMAT_SUFFIXES:
        return [stem.with_name(stem.name + suffix) for suffix in FORMAT_SUFFIXES[fmt]]
    return [stem, *sorted(stem.parent.glob(glob.escape(stem.name) + ".*"))]


def default_output(checkpoint: Path, fmt: str, ema: bool) -> Path:
    """``<run>/export/<checkpoint name>``, ``-ema`` added for EMA weights and ``-hf`` for a
    Hugging Face or timm folder, so that exports of other checkpoints or weights never meet."""
    folder = {"hf": "-hf", "timm": "-timm"}.get(fmt, "")
    name = checkpoint.stem + ("-ema" if ema else "") + folder
    return checkpoint.parent.parent / "export" / name


def main(argv: list[str]) -> None:
    parser = CommandParser(
        prog="radio-lit export",
        description="Export a training checkpoint to NVlabs/RADIO's format, safetensors, ONNX "
        "or a Hugging Face folder (nothing is overwritten without --overwrite).",
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
        help="output path without suffix (default: <run>/export/<checkpoint name>, -ema "
        "added with --ema; a .pth, .safetensors, .json or .onnx given is taken off: model.pth "
        "writes model.pth); the folder for --format hf or timm (default: that path with -hf or "
        "-timm added)",
    )
    parser.add_argument(
        "--format",
        choices=["both", "radio", "safetensors", "onnx", "hf", "timm"],
        default="both",
        help="which files to write: radio = <stem>.pth; safetensors = <stem>.safetensors and "
        "<stem>.json; both = radio and safetensors; onnx = <stem>.onnx and <stem>.onnx.data; "
        "hf = a Hugging Face model folder with its model card; timm = the backbone as a "
        "folder that timm's C-RADIO classes (timm.create_model('naflexvit_huge_patch16_radio_v4', "
        "pretrained=True, pretrained_cfg_overlay=dict(file=...)), the exact call printed) and "
        "transformers' RadioModel load; refused, naming the fix, for a student they cannot "
        "represent (a final norm, one prefix token, ViTDet windows at inference, "
        "cpe_align_corners true, other blocks, E-RADIO) (default: both)",
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
        help="export the EMA student and heads (runs with model.mesa) instead of the raw "
        "weights; the default output's name gets -ema",
    )
    parser.add_argument(
        "--name",
        default=None,
        help="--format hf: the model's name on its card (default: the run's name, -ema added "
        "with --ema)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace output files that exist (default: refuse them)",
    )
    args = parser.parse_args(argv)
    if args.name is not None and args.format != "hf":
        parser.error("--name: only --format hf writes a model card to name")
    stem = args.output or default_output(args.checkpoint, args.format, args.ema)
    if args.format not in ("hf", "timm") and stem.suffix in _FILE_SUFFIXES:
        stem = stem.with_suffix("")  # --output model.pth: the stem model, not model.pth.pth
    option = "--output" if args.output is not None else "checkpoint"
    _check_folder(stem if args.format in ("hf", "timm") else stem.parent, option)
    checkpoint_file(args.checkpoint, "checkpoint")
    formats = ["radio", "safetensors"] if args.format == "both" else [args.format]
    if not args.overwrite:
        refuse_overwrite([p for f in formats for p in outputs(f, stem)], parser.prog)
    if args.format == "hf":
        for path in export_hf(args.checkpoint, stem, args.config, args.heads, args.ema, args.name):
            print(path)
        return
    if args.format == "timm":
        paths, calls = export_timm(args.checkpoint, stem, args.config, args.ema)
        print("\n".join([*map(str, paths), *calls]))
        return
    written = []
    with stages(1 + len(formats)) as bar:
        bar.set_postfix_str("fold normalizers")
        model = exported_model(args.checkpoint, args.config, args.ema)
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
            graph = save_onnx(model, stem.with_name(stem.name + ".onnx"), resolution)
            written += [graph, external_data(graph)]
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
