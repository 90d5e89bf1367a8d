"""The ``radio-lit`` command: a LightningCLI over :class:`~radio_lit.module.DistillationModule`.

``radio-lit fit --config configs/stage1.yaml`` trains; ``--print_config`` prints the resolved
configuration; ``--model.normalizer radio_lit.normalizers.PhiS`` swaps every teacher's
normalizer. Teachers, datamodules, losses, normalizers and the optimizer are all given as
``class_path`` / ``init_args`` and validated against their typed constructors.
``radio-lit predict``, ``evaluate``, ``export`` and ``ablate`` are commands of their own
(:data:`SUBCOMMANDS`). Every user error prints one line and exits with status 2.
"""

from __future__ import annotations

import importlib
import platform
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch.distributed
from jsonargparse import ArgumentError, ArgumentParser, Namespace
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch import __version__ as pl_version
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from radio_lit import __version__
from radio_lit.callbacks.preemption import Preemption
from radio_lit.callbacks.progress import LineProgress
from radio_lit.callbacks.schedule import ScheduleCheck
from radio_lit.cli import class_parsers
from radio_lit.cli.commands import overview
from radio_lit.cli.contracts import check_contracts
from radio_lit.cli.help import (
    FULL_HELP,
    add_entry_helps,
    full_help_argv,
    short_help,
    wants_short_help,
)
from radio_lit.cli.hub import HubProbe, unreachable_download
from radio_lit.cli.overlays import (
    VALIDATING,
    overlay_error,
    restarted_classes,
    stacked_value,
    wrong_value_line,
)
from radio_lit.cli.results import evaluation_results, results_table
from radio_lit.cli.runs import RunFolderState, check_checkpoint_dir, name_run, prepare_fit
from radio_lit.cli.unused_options import add_null_keys, is_unused, refusal, refuse_given
from radio_lit.core.errors import (
    BuildInterrupted,
    ConfigError,
    Preempted,
    RadioLitError,
    checkpoint_file,
    checkpoint_mismatch,
    config_error,
    interruption,
    lost_rank,
    report,
    short_message,
    with_suggestions,
)
from radio_lit.core.executable import executable
from radio_lit.distributed.cluster import STOP, check_allocation, stop_building, under_slurm
from radio_lit.distributed.strategies import check_strategy
from radio_lit.module import DistillationModule

# jsonargparse builds the parser of each class of a config once per command, not ~9 times.
class_parsers.install()

#: ``ckpt_path`` values that Lightning resolves itself rather than reading a file.
_LIGHTNING_CKPT_NAMES = ("best", "last", "hpc")


class _RunParser(LightningArgumentParser):
    """Merges a later config's mappings into the earlier ones' (:meth:`_check_value_key`).
    Writes a run's ``config.yaml``, and dumps the config into the module's hyperparameters
    (:meth:`RadioLitCLI._dump_config`), without validating the config a second time: it was
    validated when parsed, and validating checks every class value again (0.2-0.5 s of each
    command's start; what is written is the same)."""

    #: Whether :meth:`dump` skips validation (while LightningCLI dumps the parsed config).
    parsed_dump = False

    def _check_value_key(
        self, action: Any, value: Any, key: str, cfg: Namespace | None, *args: Any, **kwargs: Any
    ) -> Any:
        """A later config's value stacked on the earlier ones'
        (:func:`radio_lit.cli.overlays.stacked_value`): a mapping (``model.teachers``, a
        teacher's ``model_kwargs``...) merged, a class whose ``class_path`` changes started
        fresh. (A flag giving the whole mapping, ``--model.feature_weights '{clip: 2.0}'``, is
        not checked here: it sets the mapping as given.) A config's ``optimizer`` or
        ``lr_scheduler`` other than ``null`` is refused (:mod:`radio_lit.cli.unused_options`)."""
        if is_unused(action) and value is not None:  # a config's optimizer: / lr_scheduler:
            raise refusal(key)
        value, cfg = stacked_value(action, value, key, cfg)
        return super()._check_value_key(action, value, key, cfg, *args, **kwargs)

    def merge_config(self, cfg_from: Namespace, cfg_to: Namespace) -> Namespace:
        """A config merged into the earlier ones; a class value it gives with another class
        replaces the earlier one whole (:func:`~radio_lit.cli.overlays.restarted_classes`)."""
        merged = super().merge_config(cfg_from, cfg_to)
        for key in restarted_classes(cfg_from, cfg_to):
            merged[key] = cfg_from[key].clone()
        return merged

    def validate(self, *args: Any, **kwargs: Any) -> None:
        """jsonargparse's check of a parsed config, each value against itself: nothing is
        stacked (:data:`~radio_lit.cli.overlays.VALIDATING`)."""
        token = VALIDATING.set(True)
        try:
            super().validate(*args, **kwargs)
        finally:
            VALIDATING.reset(token)

    def save(self, cfg: Namespace, path: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("skip_validation", True)
        super().save(cfg, path, *args, **kwargs)

    def dump(self, cfg: Namespace, *args: Any, **kwargs: Any) -> str:
        if self.parsed_dump:
            kwargs.setdefault("skip_validation", True)
        return super().dump(cfg, *args, **kwargs)


class RadioLitCLI(LightningCLI):
    """LightningCLI with fit / validate / test (and ``Trainer.predict``) for one distillation
    stage."""

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", _RunParser)
        kwargs.setdefault("seed_everything_default", 0)
        # No --optimizer / --lr_scheduler: the module builds both (radio_lit.cli.unused_options).
        kwargs.setdefault("auto_configure_optimizers", False)
        # Bad arguments raise (radio_lit.cli.app.main prints them) instead of printing the usage;
        # a long option is never taken for its prefix (--trainer.max_step is not max_steps).
        given = kwargs.get("args")
        self.command_line = [str(a) for a in (sys.argv[1:] if given is None else given)]
        # `--help` prints radio-lit's own options (radio_lit.cli.help); `--help-all`,
        # LightningCLI's full help.
        self.short_help = wants_short_help(self.command_line)
        if FULL_HELP in self.command_line:
            self.command_line = full_help_argv(self.command_line)
            if given is None:  # LightningCLI reads sys.argv (given both, it warns)
                sys.argv[1:] = self.command_line
            else:
                kwargs["args"] = self.command_line
        subcommands = self.subcommands()
        if self.command_line and self.command_line[0] in subcommands:
            # Only the parser of the subcommand given (LightningCLI builds all four: ~0.2 s).
            named = {self.command_line[0]: subcommands[self.command_line[0]]}
            self.subcommands = lambda: named  # type: ignore[method-assign]
        strict = {"exit_on_error": False, "allow_abbrev": False}
        kwargs.setdefault("parser_kwargs", {**strict, **{c: strict for c in self.subcommands()}})
        # Whether the Hub answers is found out while the arguments are parsed.
        self.hub = HubProbe().start()
        other_module = _names_a_module(self.command_line)
        super().__init__(
            LightningModule if other_module else DistillationModule,
            LightningDataModule,
            subclass_mode_model=other_module,
            subclass_mode_data=True,
            **kwargs,  # type: ignore[arg-type]
        )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``--model.teachers.help CLASS``: a teacher class's arguments
        (:func:`~radio_lit.cli.help.add_entry_helps`); the hidden ``optimizer`` and
        ``lr_scheduler`` keys that a run's config.yaml written before holds (``null`` only)."""
        add_entry_helps(parser)
        add_null_keys(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse; an unknown option or class name gets the closest known one suggested, an
        overlay config given alone the full config to stack it on
        (:mod:`radio_lit.cli.overlays`). ``--help`` prints :func:`short_help` and exits."""
        if self.short_help:
            command = self.command_line[0]
            print(short_help(parser._subcommands_action._name_parser_map[command], command))
            raise SystemExit(0)
        argv = sys.argv[1:] if args is None else args
        argv = argv if isinstance(argv, list) else []
        refuse_given(argv)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            known = overlay_error(str(error), argv) or wrong_value_line(str(error), argv)
            if known is not None:
                raise ConfigError(known) from error
            options = {o for p in _parsers(parser) for a in p._actions for o in a.option_strings}
            raise ConfigError(with_suggestions(short_message(error), options)) from error

    def _dump_config(self) -> None:
        """LightningCLI's dump of the parsed config for the module's and the data's
        hyperparameters, not validated again (:class:`_RunParser`)."""
        parser = self.parser
        parser.parsed_dump = isinstance(parser, _RunParser)
        try:
            super()._dump_config()
        finally:
            parser.parsed_dump = False

    def _parse_ckpt_path(self) -> None:
        """Refuse a missing or unreadable ``--ckpt_path`` before anything is built."""
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if path and path not in _LIGHTNING_CKPT_NAMES and not str(path).startswith("registry"):
            checkpoint_file(path, "--ckpt_path")
        try:
            super()._parse_ckpt_path()
        except Exception as error:  # torch.load of a damaged archive
            raise ConfigError(
                f"--ckpt_path: {path} cannot be read as a checkpoint "
                f"({str(error).splitlines()[0]}); give a .ckpt written by radio-lit fit"
            ) from error

    def instantiate_classes(self) -> None:
        """Build the configured classes; a constructor's error becomes a :class:`ConfigError`
        prefixed with the config key of the class that raised it. A run from a cache
        (``data: radio_lit.cache.CachedViews``) builds :class:`~radio_lit.cache.CachedTeacher`
        in place of its teachers; its saved ``config.yaml`` keeps them as given."""
        self.hub.settle()
        if self.subcommand in ("fit", "validate", "test"):
            check_allocation(self.config[self.subcommand].get("trainer") or {})
        self.given_config = self.config
        self.config = _with_cached_teachers(self.config, self.subcommand)
        try:
            super().instantiate_classes()
        except Exception as error:  # any constructor error is a configuration problem
            section = (
                self.config.get(str(self.subcommand), self.config)
                if self.subcommand
                else self.config
            )
            wrapped = config_error(error, section.clone().as_dict())
            download = unreachable_download(error, self.hub.endpoint, self.hub.switched_offline)
            if download is not None:
                key = str(wrapped).split(": ", 1)[0] if ": " in str(wrapped) else None
                wrapped = ConfigError(f"{key}: {download}" if key else download)
            raise wrapped from error
        finally:
            self.config = self.given_config

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with :class:`ScheduleCheck` and :class:`Preemption` for ``fit``, and
        :class:`LineProgress` in place of the TQDM bar when standard output is not a terminal.
        Under SLURM, Lightning's own signal handling is off (:class:`Preemption` does it)."""
        self.config = self.given_config  # what SaveConfigCallback writes
        config = self._get(self.config_init, "trainer", default={}) or {}
        given = config.get("callbacks") or []
        added: list[Any] = []
        if self.subcommand == "fit":
            added.append(ScheduleCheck())
            preemption = next((c for c in _as_list(given) if isinstance(c, Preemption)), None)
            if preemption is None:
                preemption = Preemption()
                added.append(preemption)
            preemption.command = [executable(), *self.command_line]
        if under_slurm():
            kwargs["plugins"] = _without_slurm_requeue(config.get("plugins"))
        wants_bar = config.get("enable_progress_bar", True) is not False
        if wants_bar and not sys.stdout.isatty() and not _has_progress_bar(given):
            added.append(LineProgress())
        defaults = self.trainer_defaults.get("callbacks") or []
        defaults = list(defaults) if isinstance(defaults, list) else [defaults]
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": defaults + added}
        return super().instantiate_trainer(**kwargs)

    def _run_subcommand(self, subcommand: str) -> None:
        """Run ``subcommand``. A user error, or a stop signal before training, leaves the run
        folder as it found it (:class:`~radio_lit.cli.runs.RunFolderState`): no new ``version_N``,
        and a run that ``--ckpt_path`` failed to resume keeps its files and ``config.yaml``. A
        ``fit`` goes on in the folder of the run it resumes
        (:func:`radio_lit.cli.runs.prepare_fit`),
        without Lightning's warning that its checkpoint folder is not empty."""
        ckpt_path = self.config_init[subcommand].get("ckpt_path")
        if subcommand == "fit":
            ckpt_path = prepare_fit(self.trainer, ckpt_path)
            self.config_init[subcommand]["ckpt_path"] = ckpt_path
        name_run(self.trainer, subcommand, self.command_line)
        before = RunFolderState(Path(self.trainer.log_dir) if self.trainer.log_dir else None)
        try:
            with warnings.catch_warnings():
                if ckpt_path is not None:  # the resumed run's own checkpoints are there
                    warnings.filterwarnings("ignore", message="Checkpoint directory .* not empty")
                try:
                    super()._run_subcommand(subcommand)
                except RuntimeError as error:  # Lightning loading a checkpoint that does not fit
                    known = checkpoint_mismatch(error, ckpt_path)
                    if known is None:
                        raise
                    raise known from error
        except (BuildInterrupted, Exception) as error:
            # a bad config or a stop signal (raised, or wrapped by Python:
            # core.errors.interruption) leaves no run folder; a run that trained keeps what it
            # wrote (NoTrainingProgress: exit 2 too)
            user_stop = isinstance(error, ConfigError) or interruption(error) is not None
            if user_stop and self.trainer.is_global_zero:
                before.restore()
            raise

    def _require_val_dir(self, command: str) -> None:
        if getattr(self.datamodule, "val_dir", "") is None:
            raise ConfigError(
                f"data.init_args.val_dir: radio-lit {command} reads the held-out images of "
                "val_dir, which is not set; give --data.init_args.val_dir FOLDER"
            )

    def before_fit(self) -> None:
        check_strategy(self.trainer)
        check_checkpoint_dir(self.trainer, self.model)
        resuming = self.config_init["fit"].get("ckpt_path") is not None
        check_contracts(self.trainer, self.model, resuming=resuming)

    def before_validate(self) -> None:
        self._require_val_dir("validate")
        check_contracts(self.trainer, self.model, resuming=True)

    def before_test(self) -> None:
        self._require_val_dir("test")
        check_contracts(self.trainer, self.model, resuming=True)

    def after_fit(self) -> None:
        """Print the last validation and evaluation results (:mod:`radio_lit.cli.results`) and
        say where the run and its last checkpoint are."""
        trainer = self.trainer
        log_dir = trainer.log_dir  # a broadcast under DDP: every rank takes part
        if not trainer.is_global_zero or trainer.interrupted:
            return
        table = results_table(evaluation_results(trainer), trainer.global_step)
        lines = [table, ""] if table else []
        lines.append(f"run folder: {log_dir}")
        callback = trainer.checkpoint_callback
        if callback is not None:
            path = getattr(callback, "last_model_path", "") or callback.best_model_path
            if path:
                lines.append(f"checkpoint: {path}")
        print("\n".join(lines), flush=True)


def _names_a_module(command_line: Sequence[str]) -> bool:
    """Whether the run's configs name another LightningModule (``model: class_path: ...``, e.g.
    ``radio_lit.upsamplers.FeatSharpModule`` in ``configs/featsharp/``); the model is then
    parsed as a class of its own rather than as :class:`DistillationModule`'s arguments."""
    import yaml

    from radio_lit.core.yaml_files import config_files

    names = False
    for path in config_files(command_line):
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue  # the parser reports it
        model = loaded.get("model") if isinstance(loaded, dict) else None
        if isinstance(model, dict) and ("class_path" in model or "teachers" in model):
            names = "class_path" in model
    return names


def _with_cached_teachers(config: Namespace, subcommand: str | None) -> Namespace:
    """``config``, or, for ``fit`` / ``validate`` / ``test`` from a
    :class:`~radio_lit.cache.CachedViews` cache, a copy whose teachers are
    :class:`~radio_lit.cache.CachedTeacher` (checked against the cache first). Without a
    subcommand (``radio-lit evaluate`` building a checkpoint's run) the teachers are built."""
    from radio_lit.cache import CachedViews
    from radio_lit.cache.teacher import cached_teacher_configs

    if subcommand not in ("fit", "validate", "test"):
        return config
    section = config.get(subcommand)
    data = section.get("data") if section is not None else None
    class_path = data.get("class_path") if isinstance(data, Namespace) else None
    if not class_path or class_path.rsplit(".", 1)[-1] != CachedViews.__name__:
        return config
    module, name = class_path.rsplit(".", 1)
    if getattr(importlib.import_module(module), name, None) is not CachedViews:
        return config
    folder = str(data["init_args.path"])
    teachers = section.get("model.teachers") or {}
    try:
        given = {k: v.as_dict() if isinstance(v, Namespace) else v for k, v in teachers.items()}
        replaced = cached_teacher_configs(folder, given)
    except (ValueError, OSError) as error:
        raise ConfigError(f"data.init_args.path: {error}") from error
    config = config.clone()
    section = config.get(subcommand) if subcommand else config
    section["model.teachers"] = {
        name: Namespace(class_path=entry["class_path"], init_args=Namespace(entry["init_args"]))
        for name, entry in replaced.items()
    }
    return config


def _parsers(parser: ArgumentParser) -> Iterator[ArgumentParser]:
    """``parser`` and its subcommands' parsers."""
    yield parser
    action = getattr(parser, "_subcommands_action", None)
    for sub in action.choices.values() if action is not None else ():
        yield from _parsers(sub)


def _as_list(items: Any) -> list[Any]:
    return list(items) if isinstance(items, (list, tuple)) else [items]


def _has_progress_bar(callbacks: Any) -> bool:
    return any(isinstance(c, ProgressBar) for c in _as_list(callbacks))


def _without_slurm_requeue(plugins: Any) -> list[Any]:
    """``trainer.plugins`` with a :class:`SLURMEnvironment` whose ``auto_requeue`` is off, so
    that Lightning never saves a checkpoint from inside its signal handler (Lightning issue
    #21406); :class:`~radio_lit.callbacks.Preemption` saves and requeues instead."""
    items = [p for p in _as_list(plugins) if p is not None]
    slurm = [p for p in items if isinstance(p, SLURMEnvironment)]
    for environment in slurm:
        environment.auto_requeue = False
    return items if slurm else [*items, SLURMEnvironment(auto_requeue=False)]


#: ``radio-lit <name> …`` commands beside LightningCLI's fit / validate / test: name ->
#: ``"module:function"``; the function takes the arguments after the name. ``predict`` is
#: radio-lit's own (:mod:`radio_lit.cli.predict`: an export or checkpoint, no teachers), not
#: LightningCLI's (``RadioLitCLI(args=["predict", …])`` still runs ``Trainer.predict``).
SUBCOMMANDS: dict[str, str] = {
    "ablate": "radio_lit.ablation.runner:main",
    "evaluate": "radio_lit.cli.evaluate:evaluate",
    "cache": "radio_lit.cli.cache:main",
    "export": "radio_lit.cli.export:main",
    "plan": "radio_lit.cli.plan:main",
    "predict": "radio_lit.cli.predict:main",
}


#: Errors of a subcommand (beside :class:`RadioLitError`) that are the user's input, not a bug.
_SUBCOMMAND_USER_ERRORS = (ArgumentError, ValueError, LookupError, OSError, ImportError)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``radio-lit`` console script.

    User errors (bad arguments or config values, missing files, unknown model names) print
    one message and exit with status 2; a run stopped by a training fault exits with 1;
    ``RADIO_LIT_TRACEBACK=1`` adds the traceback (radio_lit.core.errors). ``radio-lit --help``
    lists every command (:mod:`radio_lit.cli.commands`); a bare ``radio-lit`` lists them
    and exits with status 2; ``radio-lit --version`` prints the version. ``fit`` takes the
    stop signals first (:data:`radio_lit.distributed.cluster.STOP`): one while the run is built
    stops it
    in one line with 128 + the signal (and requeues a SLURM job); once training is set up,
    :class:`~radio_lit.callbacks.Preemption` saves at the next step boundary.
    """
    # Lightning 2.6 calls a torch.utils._pytree API that newer torch releases deprecate.
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):  # every command, not LightningCLI's four
        if args:
            print(overview(SUBCOMMANDS))
            return
        sys.stderr.write(overview(SUBCOMMANDS) + "\n")
        sys.exit(ConfigError.exit_code)
    if args[0] == "--version":
        print(version())
        return
    installed = STOP.install(raising=True) if args[0] == "fit" else False
    try:
        if args and args[0] in SUBCOMMANDS:
            module, function = SUBCOMMANDS[args[0]].split(":")
            try:
                getattr(importlib.import_module(module), function)(args[1:])
            except _SUBCOMMAND_USER_ERRORS as error:
                raise ConfigError(with_suggestions(short_message(error))) from error
            return
        try:
            RadioLitCLI(args=args if argv is not None else None)
        except ArgumentError as error:  # raised outside parse_arguments (e.g. --print_config)
            raise ConfigError(short_message(error)) from error
        except MisconfigurationException as error:  # Lightning: callbacks and trainer disagree
            raise ConfigError(f"trainer: {short_message(error)}") from error
        except RuntimeError as error:
            known = _lost_rank(error)
            if known is None:
                raise
            raise known from error
        finally:
            _leave_process_group()
    except Preempted as stop:  # Preemption said where the run is and how it goes on
        sys.exit(stop.exit_code)
    except RadioLitError as error:
        sys.exit(report(error, error.exit_code))
    except (BuildInterrupted, Exception) as error:  # a stop signal while the run was built
        stop = interruption(error)  # raised, or wrapped when it landed while a class was made
        if stop is None:
            raise
        sys.exit(stop_building(stop.signum))
    finally:
        if installed:
            STOP.uninstall()


def version() -> str:
    """``radio-lit --version``: radio-lit's version and those of what it runs on."""
    return (
        f"radio-lit {__version__} (torch {torch.__version__}, lightning {pl_version}, "
        f"Python {platform.python_version()})"
    )


def _lost_rank(error: RuntimeError) -> RadioLitError | None:
    """``error`` as one line when a collective failed because another rank is gone."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return lost_rank(error, dist.get_rank(), dist.get_world_size())


def _leave_process_group() -> None:
    """Destroy the process group Lightning left initialized: a gloo group still alive when the
    interpreter exits aborts the process (``terminate called without an active exception``,
    SIGABRT), which torchrun and srun report as a failed run."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
