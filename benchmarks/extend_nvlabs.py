"""The real-size extend recipe's export read by NVIDIA's own loader (by hand; not a test).

``configs/recipes/extend/c-radio-v4-h.yaml`` at CPU size (its token layout: C-RADIOv4-H's 3
summary tokens and 7 registers, then the new teacher's token; a 2-block, width-64 trunk, tiny
teachers of the release's names), started from a file of the release's layout
(``tests/configs/test_published_recipes.py::c_radio_layout_file``), one optimizer step, then
exported in NVlabs' layout and loaded by ``hubconf.radio_model`` of a local NVlabs/RADIO
checkout (its code needs ``einops``). Prints the loader's key warnings, its ``summary_idxs``,
and each output's summary and features relative to ``radio_lit.load`` of the same file
(``backbone_summary="summary_idxs"``).

    PYTHONPATH=. python benchmarks/extend_nvlabs.py <NVlabs/RADIO checkout> <work folder>
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from unittest import mock

import torch

import radio_lit
import tests.published_stand_in as stand_in
from radio_lit.export import module_inference_model, read_radio, save_radio
from tests.configs.shipped import cpu_sized
from tests.configs.test_published_recipes import EXTEND, c_radio_layout_file


def main(repo: str, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    source = c_radio_layout_file(root)
    with mock.patch.object(stand_in, "radio_stand_in", lambda adaptors: source):
        cli = cpu_sized(EXTEND[0])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    export = save_radio(module_inference_model(cli.model.eval()), root / "extended.pth")
    names = [t["name"] for t in read_radio(export)[0]["teachers"]]
    print("exported teachers:", names)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        official = torch.hub.load(repo, "radio_model", source="local", version=str(export),
                                  adaptor_names=names).eval()  # fmt: skip
    print("loader's key warnings:", [str(w.message) for w in caught if "keys" in str(w.message)])
    print("NVIDIA's summary_idxs:", official.summary_idxs.tolist())
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    ours = radio_lit.load(export, backbone_summary="summary_idxs")
    with torch.no_grad():
        got, want = official(images, feature_fmt="NLC"), ours(images)
    for name in ["backbone", *names]:
        parts = []
        for part in ("summary", "features"):
            target = getattr(want[name], part)
            if target is None:
                continue
            value = getattr(got[name], part).reshape(target.shape)
            parts.append(f"{part} {float((value - target).norm() / target.norm()):.1e}")
        print(f"{name}: {', '.join(parts)} relative to radio_lit.load")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
