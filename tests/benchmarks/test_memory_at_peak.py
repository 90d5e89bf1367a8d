"""``benchmarks/memory_at_peak.py``: what a real run holds at its memory peak, by where it
was made; on the CPU (the proxy: the run's storages, by training phase and operation) and on a
GPU (CUDA's allocator history, by allocation site; ``gpu``)."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks import memory_at_peak

ROW = re.compile(r"^\s*([\d,.]+) MiB  (.+)$")


def _rows(text: str) -> tuple[float, dict[str, float]]:
    head, *lines = text.strip().splitlines()
    peak = float(re.search(r"peak ([\d,.]+) MiB", head).group(1).replace(",", ""))
    rows = {}
    for line in lines:
        size, group = ROW.match(line).groups()
        rows[group] = float(size.replace(",", ""))
    return peak, rows


def test_the_cpu_run_is_listed_by_phase_and_operation(capsys):
    assert memory_at_peak.main(["--config", "quickstart.yaml", "--device", "cpu"]) == 0
    peak, rows = _rows(capsys.readouterr().out)
    assert peak > 0 and sum(rows.values()) == pytest.approx(peak, abs=0.2)  # the peak, whole
    phases = {group.split(" ", 1)[0].split(":")[-1] for group in rows if ":" in group}
    assert "backward" in phases  # the quickstart's peak: in a step's backward
    assert any(group.startswith("s1:") for group in rows)  # a step after the first


def test_an_unknown_config_is_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        memory_at_peak.main(["--config", "nope.yaml", "--device", "cpu"])
    assert stop.value.code == 2
    assert "--config nope.yaml: not a shipped config" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_run_is_listed_by_allocation_site(capsys):
    assert memory_at_peak.main(["--config", "quickstart.yaml", "--device", "cuda"]) == 0
    peak, rows = _rows(capsys.readouterr().out)
    assert rows["held before the fit (weights)"] > 0
    assert any(group.startswith("radio_lit/") for group in rows)
    assert sum(rows.values()) == pytest.approx(peak, abs=0.2)
