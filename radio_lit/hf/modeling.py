"""The transformers model of an exported radio-lit model: ``AutoModel.from_pretrained(folder)``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn
from transformers import PreTrainedModel

from radio_lit.hf.configuration import RadioLitConfig

if TYPE_CHECKING:
    from radio_lit.core.outputs import TeacherOutput


class RadioLitHFModel(PreTrainedModel):
    """:class:`~radio_lit.export.RadioLitModel` as a transformers model (weights under
    ``radio_model.*``, radio-lit's layer names, normalizers folded into the feature heads).

    ``model(pixel_values)`` takes ``[B, 3, H, W]`` images in ``[0, 1]`` (``H``, ``W``
    multiples of the patch size; the pixel statistics are applied inside, as in RADIO) and
    returns what ``radio_lit.load`` returns: ``{"backbone": TeacherOutput(summary [B, D],
    features [B, h, w, D]), <teacher>: TeacherOutput(summary [B, C_s] | None, features
    [B, h, w, C])}``, teacher outputs in each teacher's own space.
    """

    config_class = RadioLitConfig
    base_model_prefix = "radio_model"
    main_input_name = "pixel_values"

    def __init__(self, config: RadioLitConfig) -> None:
        super().__init__(config)
        from radio_lit.export.model import RadioLitModel

        if not config.radio or not config.adaptors:
            raise ValueError(
                "this config.json has no 'radio' or 'adaptors' entry; write the folder with "
                "radio-lit export --format hf"
            )
        self.radio_model = RadioLitModel.from_shapes(config.radio, config.adaptors)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """[choice] Every weight comes from ``model.safetensors``; a model built from its config
        alone keeps the layers' own (timm / PyTorch) initialization."""

    def forward(self, pixel_values: Tensor) -> dict[str, TeacherOutput]:
        return self.radio_model(pixel_values)
