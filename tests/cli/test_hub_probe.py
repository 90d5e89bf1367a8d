"""The Hub check run while ``radio-lit`` starts: offline mode only when the Hub cannot be
reached, and never when the user chose it."""

from __future__ import annotations

import os
import socket

from huggingface_hub import constants

from radio_lit.cli.hub import HubProbe


def test_a_reachable_hub_stays_online(monkeypatch):
    before = constants.HF_HUB_OFFLINE
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        probe = HubProbe().start()
        probe.settle()
    assert probe.reachable and not probe.switched_offline
    assert os.environ["HF_HUB_OFFLINE"] == "0" and constants.HF_HUB_OFFLINE is before


def test_an_unreachable_hub_is_set_offline_at_once(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # connection refused
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    probe = HubProbe().start()
    probe.settle()
    assert probe.switched_offline
    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True


def test_offline_mode_set_by_the_user_is_not_probed(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    probe = HubProbe().start()
    probe.settle()
    assert probe.reachable is None and not probe.switched_offline
