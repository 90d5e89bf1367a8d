"""``model.init_from`` with a bad published model, through the real ``radio-lit fit``: one line
naming the file, what was found and what to pass, exit code 2, no run folder."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from radio_lit.core.errors import TRACEBACK_ENV
from radio_lit.export import inference_model, save_radio
from radio_lit.export.convert import teacher_entry
from radio_lit.normalizers import Identity
from radio_lit.students import CPEViT, TeacherHeads
from tests import forking

ROOT = Path(__file__).resolve().parents[2]
FIT = ["fit", "--config", str(ROOT / "configs" / "quickstart.yaml")]
#: The quickstart's teachers: feature and summary widths.
WIDTHS = {"clip": (64, 32), "dino": (48, 48), "sam": (16, None)}

#: name -> (the init_from value, texts the message must contain); ``{tmp}`` is the scratch
#: folder with ``quickstart.pth`` (the quickstart's student in NVlabs' layout, but a DINO
#: head 7 wide), ``truncated.pth`` (its first half), ``other.pth`` (no RADIO model) and
#: ``cut/`` (a Hugging Face folder of NVlabs' layout whose ``config.json`` stops mid-way).
CASES = {
    "no RADIO model": (
        "{tmp}/other.pth",
        ["model.init_from", "other.pth", "no RADIO model", "keys ['encoder']", "NVlabs checkpoint"],
    ),
    "a truncated download": (
        "{tmp}/truncated.pth",
        ["model.init_from", "truncated.pth", "cannot be read", "download it again"],
    ),
    "a Hugging Face folder whose config.json was cut short": (
        "{tmp}/cut",
        ["model.init_from", "cut/config.json", "cannot be read", "download it again"],
    ),
    "a head width that disagrees with the run's teacher": (
        "{tmp}/quickstart.pth",
        ["model.init_from", "quickstart.pth", "'dino' features head of width 7", "48 channels"],
    ),
    "a name map entry that matches no shipped head": (
        "{path: {tmp}/quickstart.pth, heads: {dino: dinov2}}",
        ["model.init_from.heads", "'dinov2'", "quickstart.pth", "['clip', 'dino', 'sam']"],
    ),
    "a student of another architecture": (
        "{tmp}/quickstart.pth",
        ["model.init_from", "quickstart.pth", "depth 4", "depth 2", "model_kwargs"],
    ),
}
#: Extra options of a case.
EXTRA = {
    "a student of another architecture": [
        "--model.student.init_args.model_kwargs",
        "{depth: 2, embed_dim: 96, num_heads: 3}",
    ],
}


def published_file(path: Path) -> None:
    """The quickstart's student in NVlabs' layout, its DINO feature head 7 wide."""
    student = CPEViT(
        model="vit_tiny_patch16_224",
        max_resolution=512,
        model_kwargs={"depth": 4, "embed_dim": 96, "num_heads": 3},
        cpe_align_corners=False,
    )
    widths = {**WIDTHS, "dino": (7, 48)}
    heads = {n: TeacherHeads(96, 64, f, s) for n, (f, s) in widths.items()}
    teachers = [teacher_entry(n, "", {}, s is not None, 0) for n, (_, s) in widths.items()]
    normalizers = {n: Identity(f) for n, (f, _) in widths.items()}
    model = inference_model(student, heads, normalizers, teachers, (0.5,) * 3, (0.5,) * 3, (64, 64))
    save_radio(model, path)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, tuple[forking.Outcome, Path]]:
    root = tmp_path_factory.mktemp("init_from")
    published_file(root / "quickstart.pth")
    data = (root / "quickstart.pth").read_bytes()
    (root / "truncated.pth").write_bytes(data[: len(data) // 2])
    torch.save({"encoder": {"weight": torch.zeros(2)}}, root / "other.pth")
    (root / "cut").mkdir()
    (root / "cut" / "config.json").write_text('{"args": {"model": "vit_huge_patch16_224", "pat')
    env = {k: v for k, v in os.environ.items() if k != TRACEBACK_ENV}
    forking.ensure_server()

    def run(index: int, name: str) -> tuple[forking.Outcome, Path]:
        scratch = root / f"case{index}"
        scratch.mkdir()
        value = CASES[name][0].replace("{tmp}", str(root))
        argv = [*FIT, "--model.init_from", value, *EXTRA.get(name, [])]
        return forking.run("radio_lit.cli.app:main", [argv], scratch / "forked", env=env,
                           cwd=scratch), scratch  # fmt: skip

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {n: pool.submit(run, i, n) for i, n in enumerate(CASES)}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_published_model_gets_one_line_and_exit_code_2(outcomes, name):
    outcome, scratch = outcomes[name]
    stderr = outcome.stderr
    assert outcome.exitcode == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "radio-lit: error:" in line]
    assert len(errors) == 1, stderr[-3000:]
    message = stderr[stderr.index("radio-lit: error:") :]
    assert len(message.strip().splitlines()) <= 2, message  # and the RADIO_LIT_TRACEBACK hint
    message = message.splitlines()[0]
    for text in CASES[name][1]:
        assert text in message, f"{text!r} not in {message!r}"
    assert not list(scratch.glob("lightning_logs/*/version_*")), "a run folder was left behind"
