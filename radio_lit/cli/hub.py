"""Fail fast when the Hugging Face Hub cannot be reached.

timm, open_clip and transformers fetch pretrained weights through ``huggingface_hub``, which
retries a failed look-up for about a minute before giving up. :class:`HubProbe` checks in the
background, while the command starts, whether the Hub's host answers at all; when it does
not, the process is switched to the Hub's offline mode (``HF_HUB_OFFLINE=1``), so weights
already in the local cache still load and a missing one fails at once.
:func:`unreachable_download` then turns that failure into one line naming the repository,
the file and the local-file alternative.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any
from urllib.parse import urlparse

#: Seconds the probe waits for the Hub's host before taking it as unreachable.
PROBE_TIMEOUT_S = 3.0

_OFFLINE_VALUES = ("1", "on", "yes", "true")


def hub_offline() -> bool:
    """Whether the user set the Hub offline (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _OFFLINE_VALUES


class HubProbe:
    """A background check that the Hub's host accepts a TCP connection.

    ``start()`` returns at once; :meth:`settle` waits for the answer (at most
    :data:`PROBE_TIMEOUT_S` from the start) and, if the host is unreachable, sets the Hub's
    offline mode for this process and its children. Nothing is probed when the user already
    set offline mode.
    """

    def __init__(self, timeout: float = PROBE_TIMEOUT_S) -> None:
        self.timeout = timeout
        self.endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        self.reachable: bool | None = None
        self.switched_offline = False
        self._thread: threading.Thread | None = None

    def start(self) -> HubProbe:
        if not hub_offline():
            self._thread = threading.Thread(target=self._probe, daemon=True, name="hub-probe")
            self._thread.start()
        return self

    def _probe(self) -> None:
        url = urlparse(self.endpoint)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            with socket.create_connection((url.hostname or "", port), timeout=self.timeout):
                self.reachable = True
        except OSError:
            self.reachable = False

    def settle(self) -> None:
        """Wait for the probe; go offline if the Hub cannot be reached."""
        if self._thread is None:
            return
        self._thread.join(self.timeout + 0.5)
        self._thread = None
        if self.reachable:
            return
        os.environ["HF_HUB_OFFLINE"] = "1"
        try:
            from huggingface_hub import constants

            constants.HF_HUB_OFFLINE = True
        except ImportError:
            pass
        self.switched_offline = True


def unreachable_download(error: BaseException, endpoint: str, switched: bool) -> str | None:
    """One line for an ``error`` raised because a Hub file is neither cached nor downloadable.

    Returns ``None`` unless ``huggingface_hub``'s offline or cache-miss error is among the
    causes of ``error``; otherwise names the repository and file (read from the failing
    ``hf_hub_download`` call) and the way out.

    Args:
        error: the error raised while building a teacher or student.
        endpoint: the Hub's address.
        switched: whether :class:`HubProbe` switched the Hub offline (else the user did).
    """
    try:
        from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled
    except ImportError:
        return None
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not any(isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled)) for e in chain):
        return None
    repo, filename = _download_arguments(chain)
    what = f"{repo}/{filename}" if filename else repo or "a pretrained weight file"
    why = f"{endpoint} cannot be reached from this machine" if switched else "HF_HUB_OFFLINE is set"
    return (
        f"cannot download {what}: {why} and it is not in the Hugging Face cache; download it "
        "where the Hub is reachable (same HF_HOME, then copy the cache here) or give the "
        "model a local weights file"
    )


def _download_arguments(chain: list[BaseException]) -> tuple[str | None, str | None]:
    """``(repo_id, filename)`` of the innermost ``hf_hub_download``-like frame in ``chain``."""
    found: tuple[str | None, str | None] = (None, None)
    for error in chain:
        tb: Any = error.__traceback__
        while tb is not None:
            local = tb.tb_frame.f_locals
            if isinstance(local.get("repo_id"), str):
                found = (local["repo_id"], local.get("filename"))
            tb = tb.tb_next
    return found
