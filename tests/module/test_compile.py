"""``model.compile``: the student compiles without graph breaks, σReparam included,
and a compiled run trains with the eager run's losses."""

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from radio_lit.students.spectral_reparam import spectral_step
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student


def test_the_student_compiles_into_one_graph():
    """dynamo's explain over a training forward in a σReparam step: one graph, no breaks."""
    torch.manual_seed(0)
    student = tiny_student().train()
    with spectral_step(student):
        explanation = torch._dynamo.explain(student)(torch.randn(2, 3, 64, 64))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


class _Losses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


@pytest.mark.slow
def test_a_compiled_run_trains_with_the_eager_losses(tmp_path):
    """Student and teachers compiled (AOT autograd, no code generation: what dynamo captures,
    checked on CPU in seconds) give the eager run's losses over 3 steps."""
    runs = {}
    for option in (False, {"backend": "aot_eager"}):
        torch.manual_seed(0)
        module = tiny_module(compile=option)
        losses = _Losses()
        trainer = cpu_trainer(tmp_path, max_steps=3, callbacks=[losses])
        trainer.fit(module, image_batches(num_images=12, batch_size=4))
        runs[bool(option)] = losses.losses
    assert len(runs[True]) == 3
    torch.testing.assert_close(
        torch.tensor(runs[True]), torch.tensor(runs[False]), rtol=1e-5, atol=1e-6
    )


class _Projection(torch.nn.Module):
    """A model of the project's kind: its own class (torch 2.11's dynamo skips the frames of
    ``torch.nn``'s built-in modules compiled in place, e.g. a bare ``nn.Linear``)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


def test_each_compiled_model_gets_its_own_recompilations(monkeypatch):
    """In-place compiled models share one code object, hence dynamo's recompile_limit: with
    2 per model, two models at two shapes each all compile (none falls back to eager)."""
    from torch._dynamo.utils import counters

    from radio_lit.core import compiling

    monkeypatch.setattr(compiling, "PER_MODEL_RECOMPILES", 2)
    torch._dynamo.reset()
    counters.clear()
    models = [_Projection(4), _Projection(5)]  # two compiled versions each
    # dynamo's own patch: pytest's monkeypatch sees no attribute on a config module and
    # would delete (hide) it when undone
    with torch._dynamo.config.patch(recompile_limit=2):
        compiling.compile_models(models, {"backend": "eager", "dynamic": False})
        for rows in (2, 3):
            for model in models:
                model(torch.randn(rows, 4))
    assert counters["frames"]["ok"] == 4
