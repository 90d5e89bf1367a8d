"""E-RADIO (AM-RADIO section 5, supplement A): sizes, stride, windows, and the student contract
the training module and export rely on."""

from __future__ import annotations

import pytest
import torch
from timm.models.vision_transformer import Block

from radio_lit.export import (
    module_inference_model,
    radio_incompatibilities,
    save_radio,
    save_safetensors,
)
from radio_lit.export.files import load
from radio_lit.normalizers import PhiS
from radio_lit.students import ERadio
from radio_lit.students.eradio_layers import C2f, ConvBN, WindowedBlock
from tests.builders import cpu_trainer, image_batches, tiny_module
from tests.export.tiny_export import own_outputs


def tiny_eradio(**overrides) -> ERadio:
    args = dict(width=16, depths=(1, 1, 2, 2), window_size=2, head_dim=16)
    args.update(overrides)
    return ERadio(**args)


@pytest.mark.parametrize(("width", "paper"), [(128, 118e6), (192, 265e6)])
def test_sizes_b_and_l_are_within_ten_percent_of_table_7(width, paper):
    with torch.device("meta"):
        model = ERadio(width=width)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - paper) / paper < 0.10, count
    assert model.embed_dim == 4 * width and model.patch_size == 16


@pytest.mark.parametrize(("height", "width"), [(64, 64), (48, 80), (224, 224), (16, 32)])
def test_output_is_the_stride_16_map_for_any_multiple_of_16(height, width):
    model = tiny_eradio(num_cls_tokens=3).eval()
    out = model(torch.randn(2, 3, height, width))
    assert out.features.shape == (2, height // 16, width // 16, 64)
    assert out.summary.shape == (2, 3, 64)
    assert torch.isfinite(out.features).all() and torch.isfinite(out.summary).all()


def test_input_not_a_multiple_of_16_is_refused():
    with pytest.raises(ValueError, match="multiple of the E-RADIO output stride 16"):
        tiny_eradio()(torch.randn(1, 3, 40, 64))


def timm_twin(layer: WindowedBlock, dim: int, num_heads: int) -> Block:
    """timm's Block with the windowed block's weights (same parameter names)."""
    block = Block(dim, num_heads, mlp_ratio=2.0, qkv_bias=True).eval()
    block.load_state_dict(layer.state_dict())
    return block


def test_windowed_block_equals_timm_block_within_each_window():
    """A 3x3 map in 2x2 windows: padded windows give what timm's Block gives on their real
    tokens alone (the padding is masked out)."""
    torch.manual_seed(0)
    layer = WindowedBlock(dim=8, num_heads=2, window=2, mlp_ratio=2.0).eval()
    block = timm_twin(layer, 8, 2)
    x = torch.randn(2, 3, 3, 8)
    out = layer(x)
    for y0, y1, x0, x1 in [(0, 2, 0, 2), (0, 2, 2, 3), (2, 3, 0, 2), (2, 3, 2, 3)]:
        window = x[:, y0:y1, x0:x1]
        expected = block(window.flatten(1, 2)).reshape(window.shape)
        torch.testing.assert_close(out[:, y0:y1, x0:x1], expected, atol=1e-5, rtol=1e-5)


def test_a_map_smaller_than_the_window_is_one_global_window():
    torch.manual_seed(0)
    layer = WindowedBlock(dim=8, num_heads=2, window=7, mlp_ratio=2.0).eval()
    x = torch.randn(1, 3, 5, 8)
    expected = timm_twin(layer, 8, 2)(x.flatten(1, 2)).reshape(x.shape)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_eval_folds_batchnorm_into_the_convolution():
    """Eval mode: one convolution whose output is BatchNorm(conv(x)) with the running
    statistics; training mode: batch statistics, as BatchNorm2d."""
    torch.manual_seed(0)
    layer = ConvBN(6, 10, kernel=3, stride=2)
    with torch.no_grad():
        for tensor in (layer.bn.running_mean, layer.bn.weight, layer.bn.bias):
            tensor.normal_()
        layer.bn.running_var.uniform_(0.2, 3.0)
    x = torch.randn(2, 6, 9, 7).contiguous(memory_format=torch.channels_last)
    expected = layer.bn.eval()(layer.conv(x))
    torch.testing.assert_close(layer.eval()(x), expected, atol=1e-5, rtol=1e-5)
    train = layer.train()(x)
    torch.testing.assert_close(train.mean(dim=(0, 2, 3)), layer.bn.bias, atol=1e-5, rtol=0)


def test_c2f_concatenates_every_bottleneck_output():
    block = C2f(16, depth=3)
    assert block.cv2.conv.in_channels == (2 + 3) * 8
    assert block(torch.randn(1, 16, 5, 7)).shape == (1, 16, 5, 7)


def test_subsampled_layers_let_attention_reach_beyond_the_local_window():
    """Stage 3 alternates 2x-subsampled ("global") and local layers: with windows of 2, a
    subsampled layer mixes stride-16 positions 4 apart, a local-only stage cannot."""
    torch.manual_seed(0)
    model = tiny_eradio(depths=(1, 1, 2, 1)).eval()
    layer = model.blocks[0]
    assert layer.down is not None and model.blocks[1].down is None
    x = torch.randn(1, 8, 8, 64)
    bumped = x.clone()
    bumped[:, 0, 0] += 1.0
    with torch.no_grad():
        change = (layer(bumped) - layer(x)).abs().amax(dim=-1)[0]
        local = model.blocks[1]
        local_change = (local(bumped) - local(x)).abs().amax(dim=-1)[0]
    assert change[3, 3] > 0  # a different 2x2 window of the full-resolution map
    assert local_change[3, 3] == 0  # the local layer's position conv and window stay nearby


def test_summary_queries_get_no_weight_decay():
    """The summary tokens' learned attention-pooling queries are tokens, like a ViT's CLS
    token: no weight decay; convolution and projection weights decay, BatchNorm does not."""
    module = tiny_module(student=tiny_eradio(num_cls_tokens=2))
    groups = {group["name"]: group["params"] for group in module.parameter_groups()}
    exempt = {id(p) for p in groups["trunk_no_decay"]}
    student = module.student
    assert id(student.summary_pool.latent) in exempt
    assert id(student.stem[0].bn.weight) in exempt
    decayed = {id(p) for p in groups["trunk_decay"]}
    assert {id(student.stem[0].conv.weight), id(student.blocks[0].attn.attn.qkv.weight)} <= decayed


def test_plugs_into_training_and_export(tmp_path):
    """A training step with E-RADIO as the student, then the export: safetensors round trip
    equal to the module's own outputs; RADIO's .pth format refused in one line."""
    torch.manual_seed(0)
    module = tiny_module(student=tiny_eradio(num_cls_tokens=2), normalizer=PhiS)
    for name, output in module.run_teachers(torch.rand(4, 3, 96, 96)).items():
        module.normalizers[name].update(output.features)
        module.normalizers[name].fit()
    before = {k: v.clone() for k, v in module.student.state_dict().items()}
    cpu_trainer(tmp_path, max_steps=2).fit(module, image_batches())
    changed = [k for k, v in module.student.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("blocks.") for k in changed) and any("stem" in k for k in changed)

    module.eval()
    model = module_inference_model(module)
    assert radio_incompatibilities(model.config)
    with pytest.raises(ValueError, match="--format safetensors"):
        save_radio(model, tmp_path / "student.pth")
    path, _ = save_safetensors(model, tmp_path / "student.safetensors")
    loaded = load(path)
    images = torch.rand(2, 3, 48, 80)
    expected = own_outputs(module, images)
    with torch.no_grad():
        got = loaded(images)
    for name, (summary, features) in expected.items():
        torch.testing.assert_close(got[name].features, features, atol=1e-4, rtol=1e-4)
        if summary is not None:
            torch.testing.assert_close(got[name].summary, summary, atol=1e-4, rtol=1e-4)
