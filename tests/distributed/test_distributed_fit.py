"""The training path on 2 CPU/gloo processes: DDP and FSDP2 (``ModelParallelStrategy``).

Each strategy trains once, both ranks running ``distributed_fit.main`` in processes forked
from the tests' fork server, with ``LOCAL_RANK`` set as ``torchrun`` or SLURM set it (so
Lightning launches no process itself, DESIGN.md "Distributed rules"); the tests read what each
rank wrote. References are computed here, in one process, from the crops each rank saw.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from radio_lit.data.views import as_float_images
from radio_lit.normalizers import PhiS
from tests import forking
from tests.distributed import distributed_fit as fit

pytestmark = pytest.mark.distributed

RUN_TIMEOUT_S = 300  # both runs together take ~20 s on 2 busy cores
KINDS = ("ddp", "fsdp2")
EMA_KINDS = ("ddp-ema", "fsdp2-ema")  # with an EMA student and MESA (C-RADIOv4 report 2.3.2)
BLOCKS = "fsdp2-blocks"  # FSDP2 with a unit per student block (model.fsdp2.layout: blocks)
#: Started from a published model, its heads imported and composed with each refit (sharded
#: under FSDP2), with an EMA student whose heads are composed too.
IMPORTED = ("ddp-ema-imported", "fsdp2-ema-imported")
# Inherited variables that would make Lightning pick another cluster environment or
# override Trainer arguments.
_FOREIGN_ENV_PREFIXES = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_",
    "TORCHELASTIC_",
    "SLURM_",
    "LSB_",
    "JSM_",
    "OMPI_",
    "PMI_",
    "PL_",
)
_STATS_BUFFERS = ("count", "mean", "m2", "shift", "theta")
GROUPS = ("trunk_decay", "trunk_no_decay", "heads_decay", "heads_no_decay")

Result = list[dict[str, Any]]  # one dict per rank


_PORTS_GIVEN: set[int] = set()


def _free_port() -> int:
    """A port free on 127.0.0.1 now, and not handed to another run of this module."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def _env(port: int, rank: int) -> dict[str, str]:
    """Rank ``rank``'s environment, as ``torchrun`` or SLURM would set it: ``LOCAL_RANK`` set,
    so Lightning launches no process of its own and joins the group at ``port``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV_PREFIXES)}
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(port)
    env.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE="2")
    env["OMP_NUM_THREADS"] = "1"  # one core per rank
    if any(name == "lo" for _, name in socket.if_nameindex()):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's own connections on loopback too
    return env


@dataclass
class _Launch:
    """One running 2-process training run: both ranks forked at once from the tests' fork
    server (:mod:`tests.forking`), each running ``target(kind, out, *args)``
    (``distributed_fit.main`` unless told)."""

    kind: str
    out: Path
    ranks: list[forking.Forked]
    started: float
    target: str = f"{fit.__name__}:main"
    args: tuple[Any, ...] = ()

    @classmethod
    def start(
        cls, kind: str, out: Path, target: str = f"{fit.__name__}:main", args: tuple = ()
    ) -> _Launch:
        port = _free_port()
        ranks = [
            forking.start(target, (kind, out, *args), out / f"log{rank}", _env(port, rank))
            for rank in range(2)
        ]
        return cls(kind, out, ranks, time.monotonic(), target, args)

    def wait(self) -> tuple[int | None, str]:
        """(exit code: the first rank's that is not 0, or None after a timeout; the output of
        both ranks)."""
        deadline = self.started + RUN_TIMEOUT_S
        ended = [rank.wait(deadline) for rank in self.ranks]  # kills the ranks still running
        timed_out = time.monotonic() >= deadline and any(e.exitcode != 0 for e in ended)
        codes = [e.exitcode for e in ended if e.exitcode != 0]
        text = "".join(f"--- rank {rank} ---\n{e.stdout}{e.stderr}" for rank, e in enumerate(ended))
        code = None if timed_out else (codes[0] if codes else 0)
        return code, f"[{self.kind} run: {time.monotonic() - self.started:.0f} s]\n{text}"

    def kill(self) -> None:
        for rank in self.ranks:
            if rank.alive():
                rank.process.kill()
                rank.process.join()


def _result(launch: _Launch) -> Result:
    code, text = launch.wait()
    if code != 0 and "ddress already in use" in text:  # the free port was taken meanwhile
        for stale in launch.out.glob("rank*.pt"):
            stale.unlink()
        code, text = _Launch.start(launch.kind, launch.out, launch.target, launch.args).wait()
    tail = text[-12000:]
    if code is None:
        pytest.fail(
            f"2-process {launch.kind} run timed out after {RUN_TIMEOUT_S} s (a rank hung in "
            f"a collective?); both ranks were killed. Output:\n{tail}"
        )
    files = [launch.out / f"rank{rank}.pt" for rank in range(2)]
    if code != 0 or not all(f.is_file() for f in files):
        pytest.fail(
            f"2-process {launch.kind} run failed with exit code {code} (result files: "
            f"{[f.name for f in files if f.is_file()]}). Output:\n{tail}"
        )
    return [torch.load(f, map_location="cpu", weights_only=False) for f in files]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Result]]:
    """``run(kind)``: the per-rank results of one 2-process run of ``kind``.

    Both runs start together on first use: while one run's rank 0 waits for its rank 1 to
    import everything, the other run uses the core, which makes the pair ~30% faster.
    """
    launches = {
        kind: _Launch.start(kind, tmp_path_factory.mktemp(kind))
        for kind in (*KINDS, *EMA_KINDS, BLOCKS, *IMPORTED)
    }
    results: dict[str, Result | BaseException] = {}

    def get(kind: str) -> Result:
        if kind not in results:
            try:
                results[kind] = _result(launches[kind])
            except BaseException as error:  # pytest.fail: report it in every test that asks
                results[kind] = error
        outcome = results[kind]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    yield get
    for launch in launches.values():  # e.g. after a failure in the other run
        launch.kill()


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    """A fresh module built like the script's (same seed: the same teachers)."""
    return fit.build_module()


def _union_features(module: torch.nn.Module, batches: list[Tensor]) -> dict[str, Tensor]:
    """``{teacher: [N, C]}`` float64 features of the crops of every batch, in one process."""
    crop = as_float_images(torch.cat(batches))
    with torch.no_grad():
        outputs = module.run_teachers(crop)
    return {
        name: out.features.double().reshape(-1, out.features.shape[-1])
        for name, out in outputs.items()
    }


def _close(actual: Tensor, expected: Tensor, what: str, rtol: float = 1e-5) -> None:
    """Tolerates float32 teacher features computed here with other thread counts."""
    atol = rtol * float(expected.abs().max().clamp_min(1.0))
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def _trunk(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in weights.items() if k.startswith("student.")}


def _heads(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v for k, v in weights.items() if k.startswith("heads.")}


# -- both strategies ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_runs_the_real_strategy_on_two_ranks(run: Callable[[str], Result], kind: str) -> None:
    ranks = run(kind)
    expected = {
        "ddp": ("DDPStrategy", "DistributedDataParallel"),
        "fsdp2": ("ModelParallelStrategy", "DistillationModule"),  # FSDP2 shards in place
    }[kind]
    for rank, result in enumerate(ranks):
        info = result["info"]
        assert (info["strategy"], info["wrapped_model"]) == expected, info
        assert info["world_size"] == 2
        assert len(result["losses"]) == fit.MAX_STEPS
        assert info["finite_losses"], f"rank {rank} losses {result['losses']}"
        # TrainingProgressGuard checked every step (one all-reduce each) and found progress
        assert result["checked_groups"] == sorted(GROUPS), f"rank {rank}"
    # Each rank trained on its own shard of the data (DistributedSampler).
    for step, (a, b) in enumerate(zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)):
        assert not torch.equal(a, b), f"both ranks saw the same crops at step {step}"
    assert ranks[0]["losses"] != ranks[1]["losses"]


@pytest.mark.parametrize("kind", KINDS)
def test_normalizer_statistics_are_those_of_the_union_of_both_ranks(
    run: Callable[[str], Result], kind: str, reference: torch.nn.Module
) -> None:
    """Both ranks end with identical statistics: the plain mean and scatter of every crop
    either rank saw during the estimation steps, and PHI-S fitted on them (theorem 2.1)."""
    ranks = run(kind)
    for result in ranks:
        assert len(result["batches"]) == fit.STATS_STEPS
    first, second = (r["normalizers"] for r in ranks)
    for name in first:
        for key, value in first[name].items():
            torch.testing.assert_close(
                second[name][key],
                value,
                rtol=1e-12,
                atol=0,
                msg=lambda m, n=name, k=key: f"{kind}: rank 1 {n}.{k} != rank 0's: {m}",
            )

    features = _union_features(reference, ranks[0]["batches"] + ranks[1]["batches"])
    per_rank_samples = fit.STATS_STEPS * fit.BATCH_SIZE
    for name, y in features.items():
        state = first[name]
        samples_per_image = y.shape[0] // (2 * per_rank_samples)
        assert state["count"].item() == 2 * per_rank_samples * samples_per_image == y.shape[0]
        mean = y.mean(0)
        centered = y - mean
        _close(state["mean"], mean, f"{kind} {name}.mean")
        _close(state["m2"], centered.T @ centered, f"{kind} {name}.m2")

        # The same, by one process's Normalizer.update over the union (no torch.distributed).
        single = PhiS(y.shape[-1])
        single.update(y.float())
        _close(state["m2"], single.m2, f"{kind} {name}.m2 vs single-process update")

        # The last estimation step refitted on the union: PHI-S targets of the union have
        # zero mean and unit variance in every channel.
        assert bool(state["fitted"])
        weight = state["weight"].double()
        targets_cov = weight @ (centered.T @ centered / (y.shape[0] - 1)) @ weight.T
        _close(
            targets_cov.diagonal(),
            torch.ones(y.shape[-1], dtype=torch.float64),
            f"{kind} {name}: PHI-S target variances",
            rtol=1e-4,
        )
        _close(
            ((y - state["shift"]) @ weight.T).mean(0),
            torch.zeros_like(mean),
            f"{kind} {name}: PHI-S target mean",
            rtol=1e-4,
        )


@pytest.mark.parametrize("kind", KINDS)
def test_replicas_stay_identical_and_freeze_body_only_drops_trunk_gradients(
    run: Callable[[str], Result], kind: str
) -> None:
    ranks = run(kind)
    history = [r["weights"] for r in ranks]  # [rank][k]: weights after k optimizer steps
    assert len(history[0]) == len(history[1]) == fit.MAX_STEPS + 1
    for step, (w0, w1) in enumerate(zip(*history, strict=True)):
        for key in w0:
            torch.testing.assert_close(
                w1[key],
                w0[key],
                rtol=1e-6,
                atol=1e-7,
                msg=lambda m, k=key, s=step: f"{kind}: ranks differ on {k} after {s} steps: {m}",
            )

    weights = history[0]
    initial = weights[0]
    # FreezeBody(steps=FREEZE_STEPS): the trunk is bit-for-bit unchanged by the frozen steps ...
    for step in range(1, fit.FREEZE_STEPS + 1):
        changed = [k for k, v in _trunk(weights[step]).items() if not torch.equal(v, initial[k])]
        assert not changed, f"{kind}: trunk moved during frozen step {step}: {changed}"
    # ... while every head parameter trained from the first step;
    unchanged = [k for k, v in _heads(weights[1]).items() if torch.equal(v, initial[k])]
    assert not unchanged, f"{kind}: head parameters did not train in step 1: {unchanged}"
    # then the whole trunk trains, in sync on both ranks (checked above): its gradients
    # are reduced, because requires_grad was never toggled.
    after = weights[fit.FREEZE_STEPS + 1]
    unchanged = [k for k, v in _trunk(after).items() if torch.equal(v, initial[k])]
    assert not unchanged, f"{kind}: trunk parameters did not train after unfreezing: {unchanged}"
    for result in ranks:
        assert result["requires_grad"] == [True] * fit.MAX_STEPS


# -- FSDP2 ----------------------------------------------------------------------------------


def test_fsdp2_shards_only_the_student_and_heads(
    run: Callable[[str], Result], reference: torch.nn.Module
) -> None:
    """configure_model shards the student and heads (DTensor); teachers stay plain, whole
    and replicated; normalizer statistics stay plain float64 buffers."""
    teacher_numel = sum(p.numel() for p in reference.teachers.parameters())
    for rank, result in enumerate(run("fsdp2")):
        assert result["placements"] == {
            "teachers": ["Parameter"],
            "student": ["DTensor"],
            "heads": ["DTensor"],
        }, f"rank {rank}"
        assert result["info"]["teacher_numel"] == teacher_numel  # unsharded on every rank
        assert result["normalizer_buffer_classes"] == ["Tensor"]
        for name, state in result["normalizers"].items():
            dtypes = {k: state[k].dtype for k in _STATS_BUFFERS}
            assert set(dtypes.values()) == {torch.float64}, f"rank {rank} {name}: {dtypes}"


def test_fsdp2_trains_like_ddp(run: Callable[[str], Result]) -> None:
    """Same data, seeds and steps: FSDP2's reduce-scatter gives DDP's all-reduced update.

    Weights to float32 noise (atol 1e-5): AdamW turns the relative gradient differences of
    near-zero gradients (another reduction order) into ~1e-5 weight differences."""
    _trained_alike(run("fsdp2")[0], run("ddp")[0], "FSDP2 and DDP")


def _trained_alike(
    actual: dict[str, Any], expected: dict[str, Any], what: str, atol: float = 1e-5
) -> None:
    """Rank 0's losses (rtol 1e-5) and final weights (rtol 1e-4, ``atol``) of two runs."""
    torch.testing.assert_close(
        torch.tensor(actual["losses"]), torch.tensor(expected["losses"]), rtol=1e-5, atol=1e-6
    )
    for key, value in expected["weights"][-1].items():
        torch.testing.assert_close(
            actual["weights"][-1][key],
            value,
            rtol=1e-4,
            atol=atol,
            msg=lambda m, k=key: f"{what} final {k} differ: {m}",
        )


def test_the_ema_student_under_fsdp2_follows_as_under_ddp(run: Callable[[str], Result]) -> None:
    """The EMA student (report 2.3.2) sharded by FSDP2 like the student: the same losses (MESA
    term included) and the same final EMA weights as under DDP, on both ranks, to float32
    noise; the EMA is not the student."""
    ddp, fsdp2 = run("ddp-ema"), run("fsdp2-ema")
    torch.testing.assert_close(
        torch.tensor(fsdp2[0]["losses"]), torch.tensor(ddp[0]["losses"]), rtol=1e-5, atol=1e-6
    )
    for rank in (0, 1):
        assert ddp[rank]["ema"].keys() == fsdp2[rank]["ema"].keys() != set()
        for key, value in ddp[rank]["ema"].items():
            torch.testing.assert_close(
                fsdp2[rank]["ema"][key],
                value,
                rtol=1e-4,
                atol=1e-5,
                msg=lambda m, k=key: f"FSDP2 and DDP final EMA {k} differ: {m}",
            )
    student = ddp[0]["weights"][-1]["student.patch_embed.proj.weight"]
    assert not torch.equal(ddp[0]["ema"]["student.patch_embed.proj.weight"], student)


def test_imported_heads_compose_with_each_refit_under_fsdp2_as_under_ddp(
    run: Callable[[str], Result],
) -> None:
    """A published start's heads (``model.init_from``) composed with every refit of the
    statistics on FSDP2's shards (it died at the first refit: a plain tensor times a DTensor),
    the EMA's too: the same losses, weights and EMA as under DDP (to AdamW's float32 noise:
    atol 5e-5, a few near-zero biases; the losses to 1e-5)."""
    ddp, fsdp2 = run("ddp-ema-imported"), run("fsdp2-ema-imported")
    _trained_alike(fsdp2[0], ddp[0], "FSDP2 and DDP, imported heads", atol=5e-5)
    for key, value in ddp[0]["ema"].items():
        torch.testing.assert_close(fsdp2[0]["ema"][key], value, rtol=1e-4, atol=5e-5, msg=key)
    head = "heads.clip.features.out.weight"  # imported: not the fresh head of a plain run
    assert not torch.equal(ddp[0]["weights"][0][head], run("ddp")[0]["weights"][0][head])


def test_fsdp2_computes_the_sigma_reparam_weights_of_a_step_together(
    run: Callable[[str], Result],
) -> None:
    """The student as one FSDP2 unit (the default ``model.fsdp2.layout: student``): every
    σReparam layer's effective weight computed in one batch per step, as under DDP (the
    student's 2 blocks: qkv, proj, fc1, fc2 each); with a unit per block, each layer's as it
    runs."""
    layers = 8
    for kind in ("ddp", "fsdp2"):
        for rank, result in enumerate(run(kind)):
            assert result["spectral_batches"] == [layers] * fit.MAX_STEPS, f"{kind} rank {rank}"
    for rank, result in enumerate(run(BLOCKS)):
        assert result["spectral_batches"] == [1] * (layers * fit.MAX_STEPS), f"rank {rank}"


def test_fsdp2_layouts_train_alike(run: Callable[[str], Result]) -> None:
    """A unit per block (σReparam per layer, as the layer runs) and the student as one unit
    (σReparam batched once per step) compute the same losses and updates to float32 noise:
    the same function of the same weights, one power iteration per step either way.

    atol 5e-5: the two layouts reduce in another order, and AdamW turns the relative
    differences of near-zero gradients into weight differences of its step size's order (one
    qkv bias element of 96 differed by 1.3e-5 on one machine's CPU kernels, where the losses
    agreed to 1e-6)."""
    _trained_alike(run("fsdp2")[0], run(BLOCKS)[0], "FSDP2 layouts'", atol=5e-5)
