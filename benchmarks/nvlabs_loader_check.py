"""NVIDIA's own loader on the conformance fixtures and on radio-lit's export of each.

For every family of ``tests/export/nvlabs_files.py`` (``.pth.tar`` form): NVlabs'
``hubconf.radio_model`` (a local clone, ``torch.hub.load(..., source="local")``; it needs
``einops``) against the test's independent reference forward (backbone summary, features,
heads), then radio-lit's import (``PublishedStudent`` + ``model.init_from``), the student
perturbed by 1e-6 noise (a stand-in for a tiny step), ``save_radio``, and the export read by
NVlabs' loader and by ``radio_lit.load``. Prints relative differences and any key warnings::

    PYTHONPATH=. python benchmarks/nvlabs_loader_check.py ~/src/RADIO
"""

from __future__ import annotations

import copy
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from radio_lit.export import module_inference_model, save_radio
from radio_lit.export.files import load
from tests.export.nvlabs_files import FAMILIES, nvlabs_checkpoint, save_pth
from tests.export.radio_reference import reference_forward
from tests.export.test_nvlabs_files import WIDTHS, imported, relative


def nvlabs(repo: str, path: Path) -> tuple[torch.nn.Module, list[str]]:
    """NVlabs' model of ``path`` with every adaptor, and its key warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = torch.hub.load(repo, "radio_model", source="local", version=str(path),
                               adaptor_names=list(WIDTHS), skip_validation=True)  # fmt: skip
    return model.eval(), [str(w.message) for w in caught if "keys in state dict" in str(w.message)]


def main(repo: str) -> None:
    out = Path(tempfile.mkdtemp())
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    for family in FAMILIES:
        checkpoint = nvlabs_checkpoint(family, WIDTHS)
        path = save_pth(copy.deepcopy(checkpoint), out / f"{family}.pth.tar")
        model, warned = nvlabs(repo, path)
        with torch.no_grad():
            got = model(images)
        want = reference_forward(checkpoint, images)
        fixture = max(
            relative(got["backbone"].features, want["backbone"][1]),
            relative(got["backbone"].summary, want["backbone"][0]),
            *(relative(got[n].features, want[n][1]) for n in WIDTHS),
        )
        module = imported(path)
        with torch.no_grad():
            for param in module.student.parameters():
                param.add_(1e-6 * torch.randn_like(param))
        exported = save_radio(module_inference_model(module), out / f"{family}-export.pth.tar")
        theirs, warned_export = nvlabs(repo, exported)
        with torch.no_grad():
            a, b = theirs(images), load(exported)(images)
        export = max(
            relative(a[n].features, b[n].features.flatten(1, 2)) for n in ["backbone", *WIDTHS]
        )
        print(
            f"{family:18s} NVlabs vs reference {fixture:.1e} {warned} | export: NVlabs vs "
            f"radio_lit.load {export:.1e} {warned_export}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
