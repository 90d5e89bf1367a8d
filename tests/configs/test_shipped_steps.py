"""Every shipped config takes an optimizer step at CPU size, and each recipe's stages chain:
stage k's checkpoint starts stage k+1 through ``model.init_from`` (student, the heads of the
teachers it keeps, and the EMA student, which runs for the whole of training: RADIO #181),
and ``radio-lit export --ema`` exports the last stage's EMA."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import stage_chains
from radio_lit.callbacks import TrainingProgressGuard
from radio_lit.export.checkpoint import checkpoint_inference_model
from radio_lit.planning.configs import load_config
from tests.configs.shipped import CONFIGS, built, cpu_sized, gpu_recipe, layout_overlay

pytestmark = pytest.mark.slow

CPU_SIZED = sorted(name for name in CONFIGS if not gpu_recipe(name))
CHAINS = stage_chains(list(CONFIGS.values()))
#: Overlays of a GPU recipe that lay its partitions out anew (recipes/c-radio/balanced.yaml):
#: their layout takes a step at CPU size (one rank's share of every partition).
LAYOUTS = sorted(name for name in CONFIGS if layout_overlay(name))


def one_step(cli) -> None:
    """One optimizer step with the config's own Trainer and callbacks; the loss is finite,
    the update moved the trainable weights, and the config's TrainingProgressGuard checked
    the first update of the groups it trained (a distillation's heads; the trunk too unless
    FreezeBody holds it)."""
    module = cli.model
    guards = [c for c in cli.trainer.callbacks if isinstance(c, TrainingProgressGuard)]
    assert len(guards) == 1, "every shipped config stops a run that trains nothing"
    before = {n: p.detach().clone() for n, p in module.trainable_parameters()}
    cli.trainer.fit(module, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 1
    assert math.isfinite(float(cli.trainer.callback_metrics["train/loss"]))
    after = dict(module.trainable_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert all(torch.isfinite(p).all() for p in after.values())
    heads = {"heads_decay", "heads_no_decay"} if hasattr(module, "heads") else set()
    assert guards[0].checked_groups and heads <= guards[0].checked_groups


@pytest.mark.parametrize("name", CPU_SIZED)
def test_a_cpu_sized_config_takes_an_optimizer_step(name):
    one_step(built(name))


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_recipes_partition_layout_takes_an_optimizer_step(name):
    cli = cpu_sized(name, "--model.init_from=null")
    given = load_config(CONFIGS[name].path)["model"]["partitions"]
    parts = cli.model.partitions.partitions
    assert {n: parts[n].every_rank for n in given} == {
        n: bool(spec.get("every_rank")) for n, spec in given.items()
    }
    one_step(cli)
    packing = cli.model.student_step.packing
    if "student_packing" in load_config(CONFIGS[name].path)["model"]:
        assert packing is not None and packing.chosen == "sdpa_mask"  # the CPU's kernel, ran


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def _equal(module_state: dict, saved: dict, prefix: str, into: str = "") -> None:
    """Every ``prefix`` weight of ``saved`` is the module's ``into + key`` weight."""
    keys = [k for k in saved if k.startswith(prefix)]
    assert keys, prefix
    for key in keys:
        torch.testing.assert_close(module_state[into + key], saved[key], rtol=0, atol=0)


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_the_stages_of_a_recipe_chain_through_init_from(chain, tmp_path):
    """Each stage at CPU size (the recipe's student family shrunk, tiny teachers) starts from
    the one before, takes a step and saves; stage 1's stand-ins are stage 2's."""
    checkpoint = None
    for config in CHAINS[chain]:
        start = f"--model.init_from={checkpoint}" if checkpoint else "--model.init_from=null"
        cli = cpu_sized(config.name, start)
        module = cli.model
        if checkpoint is not None:
            saved, state = _state(checkpoint), module.state_dict()
            _equal(state, saved, "student.")
            kept = [t for t in module.teachers if any(k.startswith(f"heads.{t}.") for k in saved)]
            new = [t for t in module.teachers if t not in kept]
            for teacher in kept:
                _equal(state, saved, f"heads.{teacher}.")
            assert not any(k.startswith(tuple(f"heads.{t}." for t in new)) for k in saved)
            if module.ema is not None:  # the earlier stage's EMA, not its live weights
                _equal(state, saved, "ema.student.")
                for teacher in kept:
                    _equal(state, saved, f"ema.heads.{teacher}.")
                ema, live = (
                    saved[f"ema.heads.{kept[0]}.features.out.weight"],
                    saved[f"heads.{kept[0]}.features.out.weight"],
                )
                assert not torch.equal(ema, live)
        one_step(cli)
        checkpoint = tmp_path / f"{config.path.stem}.ckpt"
        cli.trainer.save_checkpoint(checkpoint)
    if cli.model.ema is not None:  # radio-lit export --ema: the last stage's EMA student
        config_file = tmp_path / "config.yaml"
        config_file.write_text(cli.parser.dump(cli.config, skip_none=False))
        saved = _state(checkpoint)
        exported = checkpoint_inference_model(checkpoint, config_file, ema=True)
        prefix = torch.cat([saved["ema.student.cls_token"][0], saved["ema.student.registers"][0]])
        token = exported.base_model.patch_generator.cls_token.token
        torch.testing.assert_close(token, prefix, rtol=0, atol=0)
        name = next(n for n in cli.model.teachers if f"ema.heads.{n}.summary.inp.weight" in saved)
        weights = [p for p in exported._heads[name].parameters() if p.ndim == 2]
        assert torch.equal(weights[0], saved[f"ema.heads.{name}.summary.inp.weight"])
        assert not torch.equal(weights[0], saved[f"heads.{name}.summary.inp.weight"])
