"""The parsers jsonargparse keeps (:mod:`radio_lit.cli.class_parsers`) parse, build and refuse what
freshly built ones do: the same config, the same objects, the same messages, on the first use
and when reused."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonargparse import ArgumentError

from radio_lit.cli import class_parsers
from radio_lit.cli.app import RadioLitCLI
from radio_lit.core.errors import RadioLitError

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
#: Options that reach nested class values: a swapped normalizer, shifts with an init arg, a
#: callback appended with its own arguments, a teacher init arg.
OVERRIDES = [
    "--model.normalizer=radio_lit.normalizers.PhiS",
    "--model.shifts=radio_lit.geometry.shifts.PatchShifts",
    "--model.shifts.std=0.5",
    "--trainer.callbacks+=radio_lit.evaluation.RankMe",
    "--trainer.callbacks.crop_size=32",
    "--model.teachers.dino.init_args.model_kwargs={depth: 1, embed_dim: 48, num_heads: 2}",
]
#: Bad values that jsonargparse refuses (while parsing and validating).
BAD = {
    "a value of the wrong type": ["--trainer.max_steps=many"],
    "a misspelt class name": ["--model.normalizer=radio_lit.normalizers.PHIS"],
    "an unknown init arg of a teacher": ["--model.teachers.clip.init_args.nope=1"],
    "a bad init arg of an appended callback": [
        "--trainer.callbacks+=radio_lit.evaluation.RankMe",
        "--trainer.callbacks.crop_size=many",
    ],
}


class _ParseOnly(RadioLitCLI):
    """Parses (and validates) the command line; builds nothing."""

    def instantiate_classes(self) -> None:
        pass


def _parsed(args: list[str]) -> str:
    cli = _ParseOnly(run=False, args=args)
    return cli.parser.dump(cli.config, skip_none=False)


def _refusal(args: list[str]) -> str:
    with pytest.raises((RadioLitError, ArgumentError)) as error:
        RadioLitCLI(run=False, args=args)
    return f"{type(error.value).__name__}: {error.value}"


@pytest.fixture(scope="module")
def fit_args(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("class_parsers")
    return [
        "--config",
        QUICKSTART,
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}",
    ]


def test_kept_parsers_parse_and_build_what_fresh_ones_do(fit_args):
    assert class_parsers.install()  # radio_lit.cli.app installed it on this jsonargparse
    with class_parsers.uncached():
        parsed = _parsed([*fit_args, *OVERRIDES])
        fresh = RadioLitCLI(run=False, args=fit_args)
    # The first use builds the parsers it keeps, the second reuses them.
    assert _parsed([*fit_args, *OVERRIDES]) == parsed
    assert _parsed([*fit_args, *OVERRIDES]) == parsed
    kept = RadioLitCLI(run=False, args=fit_args)
    assert kept.parser.dump(kept.config, skip_none=False) == fresh.parser.dump(
        fresh.config, skip_none=False
    )
    assert repr(kept.model) == repr(fresh.model)
    assert [type(c) for c in kept.trainer.callbacks] == [type(c) for c in fresh.trainer.callbacks]
    assert type(kept.datamodule) is type(fresh.datamodule)
    assert vars(kept.datamodule).keys() == vars(fresh.datamodule).keys()


@pytest.mark.parametrize("name", list(BAD))
def test_kept_parsers_refuse_what_fresh_ones_refuse(fit_args, name):
    args = [*fit_args, *BAD[name]]
    with class_parsers.uncached():
        message = _refusal(args)
    assert _refusal(args) == message
    assert _refusal(args) == message


def test_another_jsonargparse_is_left_alone(monkeypatch):
    """A jsonargparse whose functions take other parameters is not patched."""
    owner, name, replacement, parameters = class_parsers._PATCHES[0]
    monkeypatch.setattr(
        class_parsers, "_PATCHES", ((owner, name, replacement, [*parameters, "new"]),)
    )
    assert not class_parsers._patchable()
