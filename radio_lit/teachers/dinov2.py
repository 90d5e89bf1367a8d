"""DINOv2 teachers from timm or transformers (AM-RADIO 3.4 and 4; RADIOv2.5 uses the reg4 models).

The summary is the CLS token after the final norm; the dense features are the patch tokens
after the final norm, with the CLS and register tokens dropped.
"""

from __future__ import annotations

from radio_lit.teachers.backends import TwoBackendTeacher


class DINOv2Teacher(TwoBackendTeacher):
    """Frozen DINOv2 ViT (with or without registers) from timm or transformers.

    AM-RADIO section 4 runs DINOv2 ViT-g/14 at 224 px (its features are upsampled to the
    student's grid); RADIOv2.5 uses the 4-register variant, e.g. timm
    ``vit_giant_patch14_reg4_dinov2.lvd142m`` or transformers
    ``facebook/dinov2-with-registers-giant``.

    Outputs for a view ``[B, 3, R, R]``: ``summary`` ``[B, C]`` (normed CLS token) and
    ``features`` ``[B, R/14, R/14, C]`` (normed patch tokens, registers dropped).

    Weights come from ``checkpoint`` if given (built on the meta device, the file's tensors
    assigned), else from the library's hub if ``pretrained``, else they are random (tests).
    A DINOv3 name is refused before anything is downloaded: use :class:`DINOv3Teacher`.

    Args:
        model: timm backend: a timm model name (``timm.list_models('*dinov2*')``), optionally
            with a pretrained tag. transformers backend: an HF model id or a local directory
            written by ``save_pretrained``; with ``pretrained=False`` also a model type,
            ``"dinov2"`` or ``"dinov2_with_registers"``, built from ``model_kwargs``.
        backend: library that builds and runs the model.
        pretrained: load the library's pretrained weights (timm hub / HF hub or directory).
        checkpoint: local timm checkpoint file (timm backend; timm's own state dict or Meta's
            original DINOv2 checkpoint, which timm's ``checkpoint_filter_fn`` converts).
        resolution: input side in pixels; default the model's image size. timm builds the
            model at this size (the position embedding of pretrained weights is resampled
            once); transformers interpolates its position embedding at every call.
        model_kwargs: timm backend: keyword arguments of ``timm.create_model`` (``depth``,
            ``embed_dim``, ``num_heads``, ``img_size``...). transformers backend: config
            overrides (``hidden_size``, ``num_hidden_layers``, ``num_register_tokens``...).
        follow_student: run at the student's grid (view side ``student grid x 14``) instead of
            ``resolution`` (RADIOv2.5 4.2: DINOv2 infers at any resolution); the timm model is
            then built with ``dynamic_img_size=True`` (position embedding interpolated).
        trust_remote_code: transformers backend: let a Hugging Face repository run its own
            Python code while loading. Off by default: DINOv2 needs none, and a hub repository's
            code runs with your permissions. Checkpoints and weight files are always loaded as
            tensors only (safetensors or ``torch.load(weights_only=True)``).
        dtype: teacher precision (``bfloat16`` halves its memory; outputs stay float32).
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    model_types = ("dinov2", "dinov2_with_registers")
    timm_pattern = "*dinov2*"
    wrong_family = (("dinov3", "DINOv3Teacher"),)
