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


def test_summary_tokens_enter_the_first_block_as_timms_class_token_does(tmp_path):
    """timm adds pos_embed[:, 0] to its CLS token (no_embed_class=False): every summary token
    starts as that sum, and the patches as timm's patches (CPE grid = timm's 14 x 14 grid)."""
    import timm

    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224", num_classes=0, global_pool="", depth=2, embed_dim=32, num_heads=2
    ).eval()
    torch.save(vit.state_dict(), tmp_path / "vit.pth")
    student = tiny_student(
        max_resolution=224, num_cls_tokens=2, checkpoint=str(tmp_path / "vit.pth")
    )
    inputs = {}
    for name, model in (("timm", vit), ("student", student.eval())):
        model.blocks[0].register_forward_pre_hook(lambda _, a, n=name: inputs.setdefault(n, a[0]))
    image = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        vit(image)
        student(image)
    timm_tokens, tokens = inputs["timm"], inputs["student"]
    # The class position embedding matters: timm's CLS token alone is ~1e-6.
    assert (timm_tokens[0, 0] - vit.cls_token[0, 0]).abs().max() > 1e-3
    torch.testing.assert_close(tokens[0, 0], timm_tokens[0, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(tokens[0, 1], timm_tokens[0, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(tokens[:, 2:], timm_tokens[:, 1:], rtol=1e-5, atol=1e-6)


def test_pixel_statistics_default_to_the_timm_pretrained_config():
    assert tiny_student().pixel_mean == (0.5, 0.5, 0.5)  # augreg weights
    assert tiny_student().pixel_std == (0.5, 0.5, 0.5)
    deit = tiny_student(model="deit_tiny_patch16_224")
    assert deit.pixel_mean == pytest.approx((0.485, 0.456, 0.406))  # ImageNet statistics
    assert deit.pixel_std == pytest.approx((0.229, 0.224, 0.225))
    given = tiny_student(pixel_mean=(0.1, 0.2, 0.3), pixel_std=(0.4, 0.5, 0.6))
    assert (given.pixel_mean, given.pixel_std) == ((0.1, 0.2, 0.3), (0.4, 0.5, 0.6))


@pytest.mark.parametrize("training", [True, False])
def test_position_embeddings_are_sampled_in_float32_whatever_the_parameter_dtype(training):
    """Under a bf16 parameter policy the grid holds bf16 values; sampling it must use the
    float32 coordinates, i.e. give what float32 parameters with those values give."""
    torch.manual_seed(0)
    student = tiny_student().train(training)
    with torch.no_grad():
        student.pos_embed.copy_(student.pos_embed.bfloat16().float())  # bf16-exact values
    hw = (7, 11)
    torch.manual_seed(1)
    expected = student.position_embeddings(4, hw)
    student.to(torch.bfloat16)
    torch.manual_seed(1)
    sampled = student.position_embeddings(4, hw)
    assert sampled.dtype == torch.float32
    assert torch.equal(sampled, expected)


def test_a_checkpoint_with_the_former_grid_layout_loads():
    torch.manual_seed(0)
    student = tiny_student().eval()
    state = student.state_dict()
    old = state["pos_embed"].reshape(16, 16, 32).permute(2, 0, 1).unsqueeze(0)  # [1, D, G, G]
    state["pos_embed"] = old.clone()
    fresh = tiny_student()
    fresh.load_state_dict(state)
    assert torch.equal(fresh.pos_embed, student.pos_embed)
    assert fresh.pos_embed.shape == (256, 32)


# -- position-embedding dropout (NVlabs' pos_dropout, 0.1 in C-RADIOv4: notes 1.4) -------------


def _dropped(pos: torch.Tensor) -> torch.Tensor:
    """Which samples of ``[B, h, w, D]`` position embeddings are all zero."""
    return (pos == 0).flatten(1).all(dim=1)


def test_cpe_dropout_zeroes_whole_samples_at_rate_p_in_training():
    p, batch = 0.1, 4000
    student = tiny_student(cpe_dropout=p).train()
    plain = tiny_student(cpe_dropout=0.0).train()
    plain.load_state_dict(student.state_dict())
    torch.manual_seed(0)
    pos = student.position_embeddings(batch, (2, 3))
    torch.manual_seed(0)
    windows = plain.position_embeddings(batch, (2, 3))  # the same windows: drawn first
    dropped = _dropped(pos)
    # binomial(4000, 0.1): mean 400, std 19; 5 std either side
    assert 305 < int(dropped.sum()) < 495
    # a dropped sample is zeroed whole; a kept one is its window as is (not rescaled)
    assert not _dropped(windows).any()
    assert torch.equal(pos[~dropped], windows[~dropped])


def test_cpe_dropout_draws_from_the_rank_forward_stream():
    """The draw comes from torch's default generator, which a training step swaps for the
    rank's forward stream: two ranks drop different samples, and the global generator the
    ranks share is left where it was."""
    from radio_lit.training.random_streams import RankStream

    student = tiny_student(cpe_dropout=0.5).train()
    masks = []
    for rank in (0, 1):
        stream = RankStream(purpose=1)
        stream.start(seed=0, rank=rank)
        torch.manual_seed(7)
        with stream.active(torch.device("cpu")):
            masks.append(_dropped(student.position_embeddings(64, (2, 2))))
        after = torch.rand(4)
        torch.manual_seed(7)
        assert torch.equal(after, torch.rand(4))  # the global generator did not move
    assert not torch.equal(masks[0], masks[1])


def test_cpe_dropout_is_off_at_evaluation():
    student = tiny_student(cpe_dropout=0.5).eval()
    plain = tiny_student(cpe_dropout=0.0).eval()
    plain.load_state_dict(student.state_dict())
    images = torch.randn(64, 3, 32, 32)
    assert torch.equal(student(images).features, plain(images).features)
    assert not _dropped(student.position_embeddings(1, (4, 4))).any()


def test_the_export_of_a_cpe_dropout_student_is_its_evaluation_forward():
    from radio_lit.export import module_inference_model
    from tests.builders import tiny_module

    torch.manual_seed(0)
    module = tiny_module(student=tiny_student(cpe_dropout=0.5)).eval()
    exported = module_inference_model(module)
    images = torch.rand(8, 3, 64, 64)
    normalized = (images - torch.tensor(module.student.pixel_mean)[:, None, None]) / torch.tensor(
        module.student.pixel_std
    )[:, None, None]
    with torch.no_grad():
        expected = module.student(normalized).features
        got = exported(images)["backbone"].features
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_cpe_dropout_outside_0_1_is_one_line_naming_the_option():
    with pytest.raises(ValueError, match=r"cpe_dropout must lie in \[0, 1\), got 1.0"):
        tiny_student(cpe_dropout=1.0)


def test_training_windows_and_their_gradient_are_those_of_the_grid_sampled_per_sample():
    """One sampling of the grid for the whole batch equals ``grid_sample`` of the grid
    expanded to one copy a sample, values and the grid's gradient."""
    student = tiny_student().train()
    sampled = []

    def recorded(grid, coords, **kwargs):
        sampled.append((grid, coords, kwargs))
        return original(grid, coords, **kwargs)

    original = torch.nn.functional.grid_sample
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "grid_sample", recorded)
        windows = student.position_embeddings(3, (5, 7)).permute(0, 3, 1, 2)
    [(grid, coords, kwargs)] = sampled
    assert grid.shape[0] == 1  # one grid, not three copies
    per_sample = original(grid.expand(3, -1, -1, -1), coords.reshape(3, 5, 7, 2), **kwargs)
    torch.testing.assert_close(windows, per_sample)
    weights = torch.randn(windows.shape)
    (gradient,) = torch.autograd.grad((windows * weights).sum(), student.pos_embed)
    (expected,) = torch.autograd.grad((per_sample * weights).sum(), student.pos_embed)
    torch.testing.assert_close(gradient, expected)
