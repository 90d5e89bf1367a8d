"""The export through NVlabs/RADIO's own loader (``hubconf.radio_model``).

NVlabs/RADIO's code is not part of radio-lit: point ``RADIO_REPO`` at a local clone (its
``hubconf.py`` needs ``einops``) to run this check, e.g.
``RADIO_REPO=~/src/RADIO pytest tests/export/test_official_loader.py``. Without it the test is
skipped and :mod:`tests.export.test_radio_format` checks the file against the format's
definition instead.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

from tests.export.tiny_export import own_outputs

RADIO_REPO = os.environ.get("RADIO_REPO")

pytestmark = pytest.mark.skipif(
    not RADIO_REPO, reason="set RADIO_REPO to a local clone of NVlabs/RADIO (with einops)"
)


@pytest.mark.parametrize("size", [(64, 64), (48, 80), (272, 272)], ids=str)
def test_official_loader_builds_the_export_and_reproduces_radio_lit(trained, exported, size):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = torch.hub.load(
            str(Path(RADIO_REPO).expanduser()),
            "radio_model",
            source="local",
            version=str(exported / "student.pth"),
            adaptor_names=["clip", "dino", "sam"],
        )
    assert not [w for w in caught if "keys in state dict" in str(w.message)]
    model.eval()
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        official = model(images, feature_fmt="NLC")
    own = own_outputs(trained, images)
    close = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        official["backbone"].features, own["backbone"][1].flatten(1, 2), **close
    )
    for name in ("clip", "dino", "sam"):
        torch.testing.assert_close(official[name].features, own[name][1].flatten(1, 2), **close)
        if own[name][0] is not None:
            torch.testing.assert_close(official[name].summary, own[name][0], **close)
