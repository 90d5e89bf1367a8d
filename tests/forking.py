"""Processes forked from one fork server: the tests' way to run many short processes cheaply.

The fork server (``multiprocessing``'s ``forkserver``) imports torch, Lightning and radio-lit
once per test session (:data:`PRELOAD`) and parses the quickstart's command line once
(:mod:`tests.warm_parsers`); each process is a fork of it, so it costs a fork, not the ~7 CPU
seconds of imports (and ~0.7 s of parser building) that a fresh interpreter pays. The server
only imports and parses (no thread pool, no process group, no tensor computed), so forking it
is safe. A process runs one function (``"module:function"``) in its own environment and
folder, with its stdout and stderr in files, and exits as a command would: ``sys.exit(code)``
gives ``code``, an uncaught exception 1 (its traceback in stderr), SIGKILL -9.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
#: Imported once by the fork server; the processes' own imports are among these.
PRELOAD = [
    "torch",
    "lightning.pytorch",
    "radio_lit.cli.app",
    "radio_lit.module",
    "radio_lit.callbacks",
    "tests.builders",
    "tests.warm_parsers",  # jsonargparse's class parsers of the quickstart, built once
]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)
#: multiprocessing reads a forked process's exit status once, from a pipe, and polls every
#: earlier child whenever it starts another: a thread that starts a process while another
#: joins one can take that status first, and the joining thread then reads the pipe's end
#: (exit code 255, seen on 3 % of fast processes started two at a time). Every call that
#: polls (start, is_alive, join, exitcode) holds this lock; waiting for an end does not.
_POLLING = threading.Lock()


@dataclass
class Outcome:
    """How a forked process ended: its exit code and what it wrote."""

    exitcode: int
    stdout: str
    stderr: str
    #: Seconds from the start of ``function`` to its end, less the time the process waited
    #: for a CPU (``/proc/self/schedstat``'s run delay, where the kernel has it): what it
    #: takes on an idle machine, its sleeps and waits included; ``None`` when it was killed.
    seconds: float | None = None


def _run_delay() -> float:
    """Seconds this process's main thread has waited on a run queue (0 where the kernel does
    not say: the wall time is then taken as the process's own)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _main(
    function: str,
    args: Sequence[Any],
    env: Mapping[str, str],
    cwd: str,
    out: str,
    err: str,
    new_session: bool,
) -> None:
    start, waited = time.monotonic(), _run_delay()
    if new_session:  # its own process group: os.killpg(pid, ...) reaches its children too
        os.setsid()
    # The process inherits the fork server's start method; a command starts with the
    # platform's default. Without this, each DataLoader worker pool would start a fork server
    # of its own and import torch again (~7 s).
    multiprocessing.set_start_method(None, force=True)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    module, name = function.split(":")
    try:
        getattr(importlib.import_module(module), name)(*args)
    finally:  # also on sys.exit(code) and on an exception; not on os._exit or a kill
        seconds = time.monotonic() - start - (_run_delay() - waited)
        Path(err).with_name("seconds").write_text(f"{seconds:.3f}")


class Forked:
    """One forked process running ``function(*args)`` (:func:`start`)."""

    def __init__(self, process: Any, out: Path, err: Path) -> None:
        self.process, self.out, self.err = process, out, err
        self.seconds = out.with_name("seconds")

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        with _POLLING:
            return self.process.is_alive()

    def wait(self, deadline: float) -> Outcome:
        """Wait until ``deadline`` (``time.monotonic()``), kill the process if it is still
        running, and return how it ended."""
        if not wait([self.process.sentinel], max(0.0, deadline - time.monotonic())):
            self.process.kill()
            wait([self.process.sentinel])
        with _POLLING:
            self.process.join()
            code = self.process.exitcode
        seconds = float(self.seconds.read_text()) if self.seconds.is_file() else None
        return Outcome(code, self.out.read_text(), self.err.read_text(), seconds)


def start(
    function: str,
    args: Sequence[Any],
    folder: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    new_session: bool = False,
) -> Forked:
    """Fork ``function(*args)`` (``"module:function"``) with ``env`` (default: this process's
    environment, one thread) as its whole environment, in ``cwd`` (in a session of its own
    with ``new_session``); its stdout and stderr go to ``folder/stdout`` and
    ``folder/stderr``."""
    environment = {"OMP_NUM_THREADS": "1", **(os.environ if env is None else env)}
    # The repository is importable, whatever the folder the tests started in.
    paths = [str(REPO), *filter(None, [environment.get("PYTHONPATH")])]
    environment["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    folder.mkdir(parents=True, exist_ok=True)
    out, err = folder / "stdout", folder / "stderr"
    (folder / "seconds").unlink(missing_ok=True)  # an earlier process's, in a reused folder
    process = _CONTEXT.Process(
        target=_main,
        args=(function, list(args), environment, str(cwd), str(out), str(err), new_session),
    )
    with _POLLING:
        process.start()
    return Forked(process, out, err)


def ensure_server() -> None:
    """Start the fork server now, if it is not running (it imports :data:`PRELOAD`: seconds),
    so that a process timed from its start times itself, not the server's start."""
    multiprocessing.forkserver.ensure_running()


def run(
    function: str, args: Sequence[Any], folder: Path, timeout: float = 300, **kw: Any
) -> Outcome:
    """:func:`start` ``function(*args)`` and wait for it (at most ``timeout`` seconds)."""
    return start(function, args, folder, **kw).wait(time.monotonic() + timeout)
