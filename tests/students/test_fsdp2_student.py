"""The students under FSDP2 on 2 CPU/gloo ranks (runs ``fsdp2_student.py``): a sharded CPE
grid, float32 CPE sampling under a bf16 parameter policy, σReparam state names; E-RADIO with
every parameter sharded, gradients equal to an unsharded run's, BatchNorm statistics per rank;
each ``model.fsdp2`` setting as FSDP2 holds it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests import forking
from tests.students import fsdp2_student

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both ranks forked from the tests' fork server (:mod:`tests.forking`); their folder."""
    out = tmp_path_factory.mktemp("fsdp2_student")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    port = fsdp2_student.free_port()
    started = [
        forking.start(
            "tests.students.fsdp2_student:run_rank", (r, port, str(out)), out / f"log{r}", env=env
        )
        for r in range(fsdp2_student.WORLD_SIZE)
    ]
    deadline = time.monotonic() + 240
    for rank, outcome in enumerate([s.wait(deadline) for s in started]):
        if outcome.exitcode != 0:
            pytest.fail(f"FSDP2 rank {rank} failed ({outcome.exitcode}):\n{outcome.stderr[-6000:]}")
    return out


@pytest.fixture(scope="module")
def ranks(run: Path) -> list[dict]:
    return [torch.load(run / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def eradio_ranks(run: Path) -> list[dict]:
    return [torch.load(run / f"eradio_rank{r}.pt", weights_only=False) for r in range(2)]


def test_every_rank_holds_half_of_the_cpe_grid(ranks):
    for result in ranks:
        assert result["parameter_classes"] == ["DTensor"]
        assert result["shapes"]["pos_embed"] == (256, 32)  # [G * G, D], G = 256 px / 16
        assert result["local_shapes"]["pos_embed"] == (128, 32)
    for name, shape in ranks[0]["shapes"].items():  # dim 0 is split over the two ranks
        assert sum(r["local_shapes"][name][0] for r in ranks) == shape[0], name


def test_cpe_sampling_under_bf16_parameters_is_float32_exact(ranks):
    for result in ranks:
        assert result["compute_dtype"] == "torch.bfloat16"  # the policy is in force
        for training in (True, False):
            sampled, expected = result["sampled"][training], result["expected"][training]
            assert sampled.dtype == torch.float32
            assert torch.equal(sampled, expected), f"training={training}"


def test_sharded_state_dict_names_and_spectral_scale_gradients(ranks):
    for result in ranks:
        assert result["state_dict_keys"] == result["reference_state_dict_keys"]
        assert "blocks.0.attn.qkv.spectral_scale" in result["state_dict_keys"]
        assert "blocks.0.attn.qkv.spectral_u" in result["state_dict_keys"]
        assert result["scale_gradients"] == [True] * 8


def test_eradio_is_sharded_and_its_gradients_match_an_unsharded_run(eradio_ranks):
    for name, shape in eradio_ranks[0]["shapes"].items():  # dim 0 is split over the two ranks
        assert sum(r["local_shapes"][name][0] for r in eradio_ranks) == shape[0], name
    for result in eradio_ranks:
        for name, expected in result["expected_gradients"].items():
            torch.testing.assert_close(result["gradients"][name], expected, msg=name)


def test_eradio_batchnorm_running_statistics_are_per_rank(eradio_ranks):
    assert not torch.allclose(eradio_ranks[0]["running_mean"], eradio_ranks[1]["running_mean"])
    for result in eradio_ranks:  # eval uses this rank's own statistics
        torch.testing.assert_close(result["features"], result["expected_features"])
        torch.testing.assert_close(result["summary"], result["expected_summary"])


@pytest.fixture(scope="module")
def settings(run: Path) -> list[dict]:
    return [torch.load(run / f"settings_rank{r}.pt", weights_only=False) for r in range(2)]


def test_fsdp2_settings_reach_fsdp2(settings):
    """``model.fsdp2`` (radio_lit.students.sharding.FSDP2): the layout makes the units; a
    block's weights are freed after its forward (ZeRO-3) unless ``reshard_after_forward`` is
    false; ``prefetch`` blocks are gathered ahead in forward and behind in backward; the
    gradients are reduced in ``reduce_dtype``. The student, FSDP2's root, keeps its own
    weights gathered after the forward, for the backward."""
    blocks = ["student", "blocks.0", "blocks.1", "blocks.2"]
    for found in settings:
        assert found["default"] == {
            "units": ["student"],
            "gathered": [True] * 3,
            "forward_prefetch": [None] * 3,
            "backward_prefetch": [None] * 3,
            "reduce_dtype": torch.float32,
        }
        assert found["blocks"]["units"] == blocks
        assert found["blocks"]["gathered"] == [False] * 3
        assert found["blocks"]["forward_prefetch"] == [[]] * 3  # FSDP2's own overlap
        assert found["zero2"] == {
            "units": blocks,
            "gathered": [True] * 3,
            "forward_prefetch": [[1, 2], [2], []],
            "backward_prefetch": [[], [0], [1, 0]],
            "reduce_dtype": torch.float32,
        }
        assert found["bf16_reduce"]["reduce_dtype"] == torch.bfloat16


@pytest.mark.parametrize("version", [1, 2])
def test_sigma_reparam_steps_alike_in_every_fsdp2_layout(settings, version):
    """σReparam (each version) batched once per step in the student layout, layer by layer in
    the block layout: the features, every gradient (W, bias, the scales) and the refined ``u``
    of an unsharded step, on both ranks."""
    for found in settings:
        steps = found["steps"][version]
        reference = steps["none"]
        for layout in ("student", "blocks"):
            step = steps[layout]
            torch.testing.assert_close(step["features"], reference["features"], msg=layout)
            torch.testing.assert_close(step["u"], reference["u"], msg=layout)
            assert step["gradients"].keys() == reference["gradients"].keys()
            for name, grad in reference["gradients"].items():
                torch.testing.assert_close(step["gradients"][name], grad, msg=f"{layout} {name}")
