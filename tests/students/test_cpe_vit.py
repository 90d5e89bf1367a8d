"""CPE ViT student: any resolution and aspect ratio (AM-RADIO 4, "Multi-Resolution ViTs")."""

import pytest
import torch

from radio_lit.students import CPEViT, MLPHead


def tiny_student(**kwargs) -> CPEViT:
    args = dict(
        model="vit_tiny_patch16_224",
        max_resolution=256,
        model_kwargs=dict(depth=2, embed_dim=32, num_heads=2),
    )
    args.update(kwargs)
    return CPEViT(**args)


@pytest.mark.parametrize("size", [(64, 64), (96, 48), (32, 128), (256, 256), (320, 160)])
@pytest.mark.parametrize("training", [True, False])
def test_runs_at_any_resolution_and_aspect_ratio(size, training):
    student = tiny_student(num_cls_tokens=3, num_registers=2).train(training)
    out = student(torch.randn(2, 3, *size))
    assert out.summary.shape == (2, 3, 32)
    assert out.features.shape == (2, size[0] // 16, size[1] // 16, 32)
    assert torch.isfinite(out.features).all()


def test_eval_position_embeddings_are_the_resized_grid_windowed():
    student = tiny_student().eval()
    full = student.position_embeddings(1, (16, 16))
    assert torch.equal(full[0].reshape(16 * 16, 32), student.pos_embed)  # row-major [G*G, D]
    # A non-square input takes the top-left window of the grid resized to its longest side.
    wide = student.position_embeddings(1, (4, 8))
    square = student.position_embeddings(1, (8, 8))
    assert torch.allclose(wide, square[:, :4, :8])


def test_training_crops_differ_per_sample_and_stay_inside_the_grid():
    torch.manual_seed(0)
    student = tiny_student().train()
    pos = student.position_embeddings(4, (6, 6))
    assert pos.shape == (4, 6, 6, 32)
    assert not torch.allclose(pos[0], pos[1])
    grid = student.pos_embed
    assert pos.min() >= grid.min() - 1e-6 and pos.max() <= grid.max() + 1e-6


def test_cpe_grid_is_initialized_from_timm_position_embeddings():
    import timm

    torch.manual_seed(0)
    reference = timm.create_model(
        "vit_tiny_patch16_224", num_classes=0, depth=2, embed_dim=32, num_heads=2
    )
    torch.manual_seed(0)
    student = tiny_student(max_resolution=224)  # 14 x 14 positions: timm's own grid size
    timm_grid = reference.pos_embed[0, 1:].reshape(14, 14, 32)
    assert torch.allclose(student.pos_embed.reshape(14, 14, 32), timm_grid, atol=1e-6)


def test_bad_inputs_have_clear_errors():
    with pytest.raises(ValueError, match="multiple of the patch size"):
        tiny_student()(torch.randn(1, 3, 50, 64))
    with pytest.raises(ValueError, match="unknown timm model"):
        CPEViT("vit_nonexistent_patch16")
    with pytest.raises(FileNotFoundError):
        tiny_student(checkpoint="/nonexistent/student.pth")


def test_student_weights_load_from_a_local_file(tmp_path):
    import timm

    vit = timm.create_model(
        "vit_tiny_patch16_224",
        num_classes=0,
        global_pool="",
        depth=2,
        embed_dim=32,
        num_heads=2,
        dynamic_img_size=True,
    )
    torch.save(vit.state_dict(), tmp_path / "vit.pth")
    student = tiny_student(checkpoint=str(tmp_path / "vit.pth"))
    assert torch.equal(student.blocks[0].attn.qkv.weight, vit.blocks[0].attn.qkv.weight)


def test_mlp_head_is_linear_layernorm_gelu_linear():
    head = MLPHead(8, 16, 4)
    x = torch.randn(3, 5, 8)
    expected = head.out(torch.nn.functional.gelu(head.norm(head.inp(x))))
    assert torch.allclose(head(x), expected)
    assert head(x).shape == (3, 5, 4)


def test_parameters_are_contiguous_for_fsdp2_sharding():
    assert all(p.is_contiguous() for p in tiny_student(num_registers=1).parameters())
