"""Adaptor heads mapping the student's tokens into each teacher's space (AM-RADIO section 3.2)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from radio_lit.students.base import Student


class MLPHead(nn.Module):
    """2-layer MLP ``Linear -> LayerNorm -> GELU -> Linear`` over the last dim.

    AM-RADIO 3.2: the input width is the student's, the hidden width the largest teacher
    width, the output width the teacher's. ``[..., in_dim] -> [..., out_dim]``. The last
    linear layer is ``self.out`` so export can fold a normalizer's affine map into it
    (PHI-S A.6, eqs. 39-44).

    ``[choice]`` for C-RADIOv4 (notes 1.4, 7.4): this is AM-RADIO's 2-layer head for every
    teacher, summary and features. NVlabs' released models use their "MLP v2" heads: an
    optional pre-norm, ``Linear(in -> hidden)``, ``num_inner`` residual blocks
    ``LayerNorm -> GELU -> Linear(hidden -> hidden)``, then ``LayerNorm -> GELU ->
    Linear(hidden -> out)`` (optionally a pixel-shuffle upsampling dense head), and v4's
    release adds an ``attn`` dense head (2 ViT blocks before an MLP v2). This head is MLP v2
    with no pre-norm and ``num_inner = 0``, so a RADIO-format export loads it as one
    (:mod:`radio_lit.export.model`); deeper v2 heads and the ``attn`` head are not built: which
    teacher used which head, their hidden widths and ``num_inner`` are not published (they
    are read from the released state dicts, notes 6.13). A published head imported by
    ``model.init_from`` (:mod:`radio_lit.export.published`) keeps its own depth: ``num_inner``
    residual blocks ``inner.<i>`` (``LayerNorm -> GELU -> Linear``, NVlabs' ``blocks.<i>``) and
    ``pre_norm`` (``pre``: ``LayerNorm -> GELU`` on the input, NVlabs' ``pre_norm``).
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        num_inner: int = 0,
        pre_norm: bool = False,
    ) -> None:
        super().__init__()
        self.pre = nn.Sequential(nn.LayerNorm(in_dim), nn.GELU()) if pre_norm else None
        self.inp = nn.Linear(in_dim, hidden_dim)
        self.inner = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim))
            for _ in range(num_inner)
        )
        self.norm = nn.LayerNorm(hidden_dim)
        self.act = nn.GELU()
        self.out = nn.Linear(hidden_dim, out_dim)

    @property
    def shape(self) -> list[int]:
        """``[in, hidden, out, num_inner, pre_norm]``: the arguments that rebuild this head."""
        pre = int(self.pre is not None)
        return [self.inp.in_features, self.inp.out_features, self.out.out_features,
                len(self.inner), pre]  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        x = self.inp(x if self.pre is None else self.pre(x))
        for block in self.inner:
            x = x + block(x)
        return self.out(self.act(self.norm(x)))


def mlp_shape(state: Mapping[str, Tensor], prefix: str = "") -> list[int]:
    """The :attr:`MLPHead.shape` of the head whose weights ``state`` holds under ``prefix``
    (radio-lit's layer names: ``inp``, ``inner.<i>``, ``pre``, ``norm``, ``out``)."""
    hidden, in_dim = state[prefix + "inp.weight"].shape
    inner = {k[len(prefix) :].split(".")[1] for k in state if k.startswith(prefix + "inner.")}
    pre = int(prefix + "pre.0.weight" in state)
    return [int(in_dim), int(hidden), int(state[prefix + "out.weight"].shape[0]), len(inner), pre]


class TeacherHeads(nn.Module):
    """The summary head and feature head of one teacher (summary head absent for SAM)."""

    def __init__(
        self, student_dim: int, hidden_dim: int, feature_dim: int, summary_dim: int | None
    ) -> None:
        super().__init__()
        self.features = MLPHead(student_dim, hidden_dim, feature_dim)
        self.summary = (
            MLPHead(student_dim, hidden_dim, summary_dim) if summary_dim is not None else None
        )

    @classmethod
    def from_state(cls, state: Mapping[str, Tensor]) -> TeacherHeads:
        """The heads whose weights ``state`` holds (``features.*``, ``summary.*``), with each
        head's own depth (:func:`mlp_shape`); the weights are not loaded."""
        features = mlp_shape(state, "features.")
        heads = cls(features[0], features[1], features[2], None)
        heads.features = MLPHead(*features)
        if "summary.inp.weight" in state:
            heads.summary = MLPHead(*mlp_shape(state, "summary."))
        return heads


def summary_token_slots(has_summary: Mapping[str, bool], student: Student) -> dict[str, int]:
    """Teacher name -> index of the student summary token its summary head reads.

    With the student's ``summary_tokens`` (the teacher of each token, declared for every stage
    of a run), teacher ``t`` reads token ``summary_tokens.index(t)``: the same slot in every
    stage; names of teachers a stage lacks leave their tokens unused (C-RADIOv4's stages 1-2,
    before SAM3 joins), and every teacher with a summary must have a name. Otherwise its
    ``num_cls_tokens`` is 1 (shared token), the number of teachers with a summary (the k-th of
    them reads token k), or the number of teachers (teacher i reads token i: NVlabs/RADIO's
    ``cls_token_per_teacher`` layout, where a teacher without summary, such as SAM, leaves its
    token unused). Teachers without a summary get no entry.
    """
    teachers = list(has_summary)
    with_summary = [n for n in teachers if has_summary[n]]
    num_tokens, names = student.num_cls_tokens, student.summary_tokens
    if names is not None:
        missing = [n for n in with_summary if n not in names]
        if missing:
            raise ValueError(
                f"model.student.init_args.summary_tokens={list(names)} has no token for "
                f"{missing} (teachers with a summary): add them to the list, after the names "
                "already there so that earlier stages' tokens keep their slots, or set their "
                "init_args.summary: false (a published model's own backbone entry, whose "
                "tokens are its teachers')"
            )
        return {n: list(names).index(n) for n in with_summary}
    if num_tokens == 1:
        return dict.fromkeys(with_summary, 0)
    if num_tokens == len(with_summary):
        return {n: i for i, n in enumerate(with_summary)}
    if num_tokens == len(teachers):
        return {n: teachers.index(n) for n in with_summary}
    raise ValueError(
        f"the student has {num_tokens} summary tokens for {len(teachers)} teachers, "
        f"{len(with_summary)} of them with a summary ({with_summary}); set "
        f"model.student.init_args.num_cls_tokens to 1 (shared), {len(with_summary)} (one per "
        f"summary teacher) or {len(teachers)} (one per teacher, NVlabs/RADIO's layout), or name "
        "the teacher of each token with model.student.init_args.summary_tokens (teachers of "
        "later stages included)"
    )


def teacher_heads(student_dim: int, widths: Mapping[str, tuple[int, int | None]]) -> nn.ModuleDict:
    """Every teacher's :class:`TeacherHeads` from its ``(feature_dim, summary_dim)``; the
    hidden width is the largest teacher width (AM-RADIO 3.2)."""
    hidden = max(max(f, s or 0) for f, s in widths.values())
    return nn.ModuleDict(
        {name: TeacherHeads(student_dim, hidden, f, s) for name, (f, s) in widths.items()}
    )
