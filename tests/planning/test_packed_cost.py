"""The plan's price of a packed student forward (radio_lit/planning/packed_cost.py) against
torch's own FLOP count of the packed forward it prices."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from radio_lit.planning.packed_cost import packed_forward_flops, padded_forward_flops
from radio_lit.students import CPEViT


def test_packed_price_is_torchs_count_of_the_packed_blocks():
    student = CPEViT(
        "vit_tiny_patch16_224",
        max_resolution=256,
        num_registers=2,
        model_kwargs=dict(depth=2, embed_dim=32, num_heads=2),
        spectral_reparam=False,
    ).eval()
    views = [torch.randn(3, 3, 32, 32), torch.randn(1, 3, 64, 48)]
    with torch.no_grad():
        tokens = [student.embed(v)[0] for v in views]
        with FlopCounterMode(display=False) as counter:
            student(views)
    # The patch embedding is no block: its convolution is counted apart.
    embed = sum(
        v for k, v in counter.get_flop_counts()["Global"].items() if "convolution" in str(k)
    )
    price = packed_forward_flops(2, 32, 4.0, [(t.shape[0], t.shape[1]) for t in tokens])
    assert price["tokens"] == 3 * (3 + 4) + 1 * (3 + 12)
    # torch's counter sees no FLOPs in CPU SDPA with a mask: the rest is the token-wise GEMMs.
    assert counter.get_total_flops() - embed == price["linear"]
    assert price["attention"] == 2 * 4 * 32 * (3 * 7**2 + 15**2)  # per image, not (3*7+15)^2
    padded = padded_forward_flops(2, 32, 4.0, [(3, 7), (1, 15)])
    assert padded["tokens"] == 4 * 15 and padded["linear"] > price["linear"]
