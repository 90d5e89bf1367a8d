"""What a cache's teacher outputs were computed from: Hub commits and the weights digest."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radio_lit.cache import identity
from radio_lit.cache.manifest import weights_digest


def test_a_hub_repository_moved_to_another_commit_is_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository named in a teacher's config (directly, or as a timm model's Hub id) is
    recorded with the commit its ref points to in the local Hub cache; a re-download that
    moves the ref is one line."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    refs = {}
    for repo in ("facebook/dinov3-vitl16", "timm/vit_small_patch14_dinov2.lvd142m"):
        ref = tmp_path / f"models--{repo.replace('/', '--')}" / "refs" / "main"
        ref.parent.mkdir(parents=True)
        ref.write_text("a" * 40)
        refs[repo] = ref
    configs = {
        "dinov3": {"init_args": {"model": "facebook/dinov3-vitl16"}},
        "dino": {"init_args": {"model": "vit_small_patch14_dinov2.lvd142m"}},
    }
    recorded = identity.record(configs, "32-true")
    assert recorded["hub"] == {
        "dinov3": {"facebook/dinov3-vitl16@main": "a" * 40},
        "dino": {"timm/vit_small_patch14_dinov2.lvd142m@main": "a" * 40},
    }
    assert identity.stale(recorded) == []
    refs["facebook/dinov3-vitl16"].write_text("b" * 40)
    assert identity.stale(recorded) == [
        f"teacher dinov3's Hub repository facebook/dinov3-vitl16@main points to {'b' * 40}, "
        f"the cache was written from {'a' * 40}"
    ]


def test_the_weights_digest_sees_permuted_and_slightly_changed_weights() -> None:
    """Sums and sums of squares (the old digest) are blind to both."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    digest = weights_digest(layer)
    with torch.no_grad():
        layer.weight.copy_(layer.weight.flip(0))
    assert weights_digest(layer) != digest
    with torch.no_grad():
        layer.weight.copy_(layer.weight.flip(0))
    assert weights_digest(layer) == digest
    with torch.no_grad():
        layer.weight[0, 0] = torch.nextafter(layer.weight[0, 0], torch.tensor(1.0))
    assert weights_digest(layer) != digest
