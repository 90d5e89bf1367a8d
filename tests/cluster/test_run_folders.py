"""Which folder a run writes into: a continued run keeps its folder (TensorBoard hides the steps
logged after the checkpoint), a variant of a config is named for what differs from it."""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only

from radio_lit.cli.runs import (
    RunFolderState,
    check_checkpoint_dir,
    name_run,
    prepare_fit,
    what_differs,
)


def _trainer(save_dir: Path, name: str = "quickstart") -> Trainer:
    logger = TensorBoardLogger(save_dir=str(save_dir), name=name)
    return Trainer(logger=logger, accelerator="cpu", devices=1, enable_progress_bar=False)


def _checkpoint(run: Path, step: int) -> Path:
    path = run / "checkpoints" / "last.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"global_step": step}, path)
    return path


def test_ckpt_path_into_a_run_continues_its_folder_and_hides_the_later_steps(tmp_path):
    ckpt = _checkpoint(tmp_path / "quickstart" / "version_3", step=40)
    (tmp_path / "quickstart" / "version_4").mkdir()  # a later run: Lightning would pick 5
    trainer = _trainer(tmp_path)
    assert prepare_fit(trainer, str(ckpt)) == str(ckpt)
    assert trainer.logger.log_dir == str(tmp_path / "quickstart" / "version_3")
    assert trainer.logger._kwargs["purge_step"] == 40  # SummaryWriter(purge_step=40)


def test_a_checkpoint_of_another_run_name_starts_a_new_folder(tmp_path):
    ckpt = _checkpoint(tmp_path / "stage1" / "version_0", step=40)
    trainer = _trainer(tmp_path, name="stage2")
    prepare_fit(trainer, str(ckpt))
    assert trainer.logger.version == 0
    assert "purge_step" not in trainer.logger._kwargs


def test_a_variant_of_a_config_is_named_for_what_differs(tmp_path):
    base = ["--config", "configs/quickstart.yaml"]
    assert what_differs(["fit", *base]) == []
    assert what_differs(
        ["fit", *base, "--model.normalizer", "radio_lit.normalizers.Standardize"]
    ) == ["normalizer=Standardize"]
    assert what_differs(["fit", *base, "--model.loss=radio_lit.losses.HybridMSE"]) == [
        "loss=HybridMSE"
    ]
    balancer = '{"class_path": "radio_lit.losses.AdaLoss"}'
    assert what_differs(["fit", *base, "--model.balancer", balancer]) == ["balancer=AdaLoss"]
    assert what_differs(["fit", *base, "--config", "configs/ablations/zca.yaml"]) == ["zca"]
    cache = ["--data", "radio_lit.cache.CachedViews", "--data.init_args.path", "/data/cache/"]
    assert what_differs(["fit", *base, *cache]) == ["data=CachedViews", "path=cache"]
    placement = ["--trainer.devices", "2", "--trainer.strategy", "ddp", "--ckpt_path", "x.ckpt"]
    assert what_differs(["fit", *base, *placement, "--model.init_from", "s1.ckpt"]) == []

    (tmp_path / "quickstart" / "version_0").mkdir(parents=True)
    (tmp_path / "quickstart" / "version_1-loss=MSE").mkdir()
    trainer = _trainer(tmp_path)
    name_run(trainer, "test", ["test", *base, "--model.normalizer", "radio_lit.normalizers.PhiS"])
    assert trainer.logger.version == "version_2-test-normalizer=PhiS"
    Path(trainer.logger.log_dir).mkdir()
    trainer = _trainer(tmp_path)
    name_run(trainer, "fit", ["fit", *base])
    assert trainer.logger.version == "version_3"  # nothing differs: the next number


def test_the_ranks_of_a_torchrun_leave_one_run_folder(tmp_path, monkeypatch):
    """Rank 1 names its run before the ranks have a process group and, finding rank 0's new
    folder, guesses the next number: it must not create that folder (Lightning gives it
    rank 0's once the group is up), or an empty ``version_1-…/checkpoints`` is left."""
    module = torch.nn.Linear(2, 2)
    command = ["fit", "--config", "configs/quickstart.yaml", "--model.fsdp2.layout", "blocks"]
    rank0 = _trainer(tmp_path)
    name_run(rank0, "fit", command)
    check_checkpoint_dir(rank0, module)
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": "test", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500"}  # fmt: skip
    for key, value in torchrun.items():
        monkeypatch.setenv(key, value)
    for rank_zero in (rank_zero_only, utils_rank_zero_only):  # the Trainer sets them to 1
        monkeypatch.setattr(rank_zero, "rank", rank_zero.rank)
    logger = TensorBoardLogger(save_dir=str(tmp_path), name="quickstart")
    rank1 = Trainer(logger=logger, accelerator="cpu", devices=2, strategy="ddp")
    assert rank1.global_rank == 1
    name_run(rank1, "fit", command)
    check_checkpoint_dir(rank1, module)
    runs = [p.name for p in (tmp_path / "quickstart").iterdir()]
    assert runs == ["version_0-fsdp2.layout=blocks"]


def test_a_stopped_command_leaves_the_run_folder_as_it_was_unless_it_saved(tmp_path):
    """What ``radio-lit fit`` puts back when a user error or a signal stops it: a new folder
    is removed, a continued one gets its config.yaml back and loses only the files the command
    added; once the command has written a checkpoint, nothing is removed (it trained)."""
    new = tmp_path / "version_1"
    state = RunFolderState(new)
    (new / "checkpoints").mkdir(parents=True)
    (new / "config.yaml").write_text("refused")
    state.restore()
    assert not new.exists()

    run = tmp_path / "version_0"
    _checkpoint(run, step=40)
    (run / "config.yaml").write_text("the run's")
    (run / "events.out.tfevents.1").write_bytes(b"logged")
    before = sorted(run.rglob("*"))
    state = RunFolderState(run)
    (run / "config.yaml").write_text("refused")
    (run / "events.out.tfevents.2").write_bytes(b"purge_step=40")
    (run / "hparams.yaml").write_text("{}")
    state.restore()
    assert sorted(run.rglob("*")) == before
    assert (run / "config.yaml").read_text() == "the run's"

    state = RunFolderState(run)
    (run / "events.out.tfevents.3").write_bytes(b"steps 40-60")
    torch.save({"global_step": 60}, run / "checkpoints" / "last.ckpt")
    state.restore()
    assert (run / "events.out.tfevents.3").exists()
