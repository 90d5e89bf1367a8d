"""The student's options as DistillationModule uses them: input statistics and weight decay."""

from radio_lit.students import SpectralLinear
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student


def test_student_input_statistics_default_to_the_students_pretrained_config():
    module = tiny_module()  # timm vit_tiny_patch16_224 (augreg): mean = std = 0.5
    assert module.conditioner.values == (module.student.pixel_mean, module.student.pixel_std)
    assert module.conditioner.values == ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    given = tiny_module(student_mean=(0.4, 0.5, 0.6), student_std=(0.2, 0.3, 0.4))
    assert given.conditioner.values == ((0.4, 0.5, 0.6), (0.2, 0.3, 0.4))
    imagenet = tiny_module(student=tiny_student(model="deit_tiny_patch16_224"))
    assert imagenet.conditioner.values[0] == (0.485, 0.456, 0.406)


def test_spectral_reparam_scales_get_weight_decay(tmp_path):
    """PHI-S A.7: weight decay on the σReparam scale keeps spectral norms small; the scales
    are 1-D, which alone would put them with biases and norms in the no-decay group."""
    module = tiny_module()
    cpu_trainer(tmp_path, max_steps=1).fit(module, image_batches())
    groups = {g["name"]: g for g in module.trainer.optimizers[0].param_groups}
    decayed = {id(p) for p in groups["trunk_decay"]["params"]}
    exempt = {
        id(p) for name in ("trunk_no_decay", "heads_no_decay") for p in groups[name]["params"]
    }
    scales = [m.spectral_scale for m in module.student.modules() if isinstance(m, SpectralLinear)]
    assert len(scales) == 8 and all(id(s) in decayed for s in scales)
    assert groups["trunk_decay"]["weight_decay"] == 0.02
    assert groups["trunk_no_decay"]["weight_decay"] == 0.0
    for name, param in module.trainable_parameters():
        if name.endswith(("bias", "pos_embed", "cls_token")) or ".norm" in name:
            assert id(param) in exempt, name
