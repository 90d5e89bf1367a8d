"""A published start carried on, read by NVIDIA's own loader (by hand; not a test).

Stage 1 starts from an NVlabs-layout file whose pixel conditioner is OpenAI CLIP's (not the
student class's 0.5 default; the tiny model of ``tests/export/test_published_carries_on.py``,
PHI-S fitted), 3 steps at learning rate 0 with the statistics refitted; stage 2 starts from
stage 1's ``last.ckpt``, 3 more steps; stage 2 is exported in NVlabs' layout and loaded by
``hubconf.radio_model`` of a local NVlabs/RADIO checkout. Prints NVIDIA's conditioner mean and
each output's features relative to the source's (radio_lit.load of the source file).

    PYTHONPATH=. python benchmarks/carry_on_nvlabs.py <NVlabs/RADIO checkout> <work folder>
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

import radio_lit
from radio_lit.export import checkpoint_inference_model, module_inference_model, save_radio
from radio_lit.normalizers import PhiS
from tests.builders import tiny_module, tiny_student
from tests.export import test_published_carries_on as carried


def main(repo: str, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    student = tiny_student(num_registers=2, cpe_align_corners=False)
    module = tiny_module(student=student, teachers=carried._teachers(), normalizer=PhiS,
                         student_mean=carried.CLIP_MEAN, student_std=carried.CLIP_STD)  # fmt: skip
    for name, output in module.run_teachers(torch.rand(4, 3, 96, 96)).items():
        module.normalizers[name].update(output.features)
        module.normalizers[name].fit()
    source = save_radio(module_inference_model(module.eval()), root / "published.pth")
    stage1 = carried._adapted(root / "stage1", source)
    stage2 = carried._adapted(root / "stage2", stage1)
    export = save_radio(checkpoint_inference_model(stage2), root / "stage2.pth")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        official = torch.hub.load(repo, "radio_model", source="local", version=str(export),
                                  adaptor_names=["clip", "dino", "sam"]).eval()  # fmt: skip
    print("loader's key warnings:", [str(w.message) for w in caught if "keys" in str(w.message)])
    mean = official.input_conditioner.norm_mean.flatten().tolist()
    print("NVIDIA's conditioner mean:", mean, "source's:", list(carried.CLIP_MEAN))
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = official(images, feature_fmt="NLC"), radio_lit.load(source)(images)
    for name in ["backbone", "clip", "dino", "sam"]:
        target = want[name].features.flatten(1, 2)
        relative = (got[name].features - target).norm() / target.norm()
        print(f"{name}: features {relative:.1e} relative to the source")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
