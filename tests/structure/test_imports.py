"""The package's import graph: its layers, no upward import, no circle.

Every ``import`` / ``from ... import`` of every module under ``radio_lit/`` counts, wherever it
stands (top level, inside a function, under ``TYPE_CHECKING``): a function-level import is
still a dependency. A module belongs to the top-level folder (or root module) it lives in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[2] / "radio_lit"

#: radio-lit's layers, lowest first (README, "Layout"; DESIGN.md): a part imports only from
#: parts below it (and from itself). ``module`` is ``radio_lit/module.py``, the orchestrator.
LAYERS = (
    "core",  # errors, the compile option, a teacher's output type: shared leaves
    "distributed",  # strategies, SLURM and signals
    "normalizers",
    "losses",
    "data",
    "geometry",  # feature grids, shift-equivariant views
    "students",
    "export",  # the inference model and its files (a RADIO teacher can load one)
    "teachers",
    "training",  # the step's parts
    "upsamplers",  # FeatSharp: runs teachers, is one (UpsampledTeacher); per-rank streams
    "metrics",
    "cache",
    "hf",  # transformers' classes and the Hugging Face folder
    "module",
    "callbacks",
    "evaluation",
    "ablation",
    "planning",  # radio-lit plan's estimates: builds what fit builds (the module), below cli
    "cli",
)
#: The entry points above every layer: ``import radio_lit``, ``python -m radio_lit``, and the
#: old import paths (:mod:`radio_lit._aliases`, which names modules only as strings).
ENTRY = ("radio_lit", "radio_lit.__main__", "radio_lit._aliases")


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Module -> radio_lit modules it imports (a package import counts for the package)."""
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def layer(module: str) -> str:
    """The part of the package ``module`` belongs to (its top-level folder or root module)."""
    return module.split(".")[1]


def part_graph(graph: nx.DiGraph) -> nx.DiGraph:
    """The import graph between parts (folders and root modules), entry points left out."""
    parts = nx.DiGraph()
    for a, b in graph.edges:
        if a not in ENTRY and b not in ENTRY and layer(a) != layer(b):
            parts.add_edge(layer(a), layer(b), example=(a, b))
    return parts


def test_every_part_has_a_layer():
    graph = import_graph()
    unplaced = {layer(n) for n in graph if n not in ENTRY} - set(LAYERS)
    assert not unplaced, f"parts of radio_lit without a layer in LAYERS: {sorted(unplaced)}"


def test_no_part_imports_a_higher_one():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [
        f"{data['example'][0]} -> {data['example'][1]}"
        for a, b, data in part_graph(import_graph()).edges(data=True)
        if rank[b] > rank[a]
    ]
    assert not upward, f"imports from a lower layer up to a higher one: {upward}"


def test_no_import_circle():
    graph = import_graph()
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import circles in radio_lit: {cycles[:5]}"
    between = list(nx.simple_cycles(part_graph(graph)))
    assert not between, f"import circles between radio_lit's folders: {between[:5]}"


def test_the_graph_sees_imports():
    graph = import_graph()
    assert nx.has_path(graph, "radio_lit.cli.app", "radio_lit.module")
    assert graph.has_edge("radio_lit.training.teachers", "radio_lit.geometry.grid")
    # a function-level import counts: the check would catch one going up
    assert graph.has_edge("radio_lit.teachers.radio_source", "radio_lit.export.files")


def test_the_package_root_holds_entry_points_only():
    files = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert files == ["__init__.py", "__main__.py", "_aliases.py", "module.py"], files
