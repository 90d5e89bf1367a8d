"""The package's import graph: no circles, and no lower layer reaching up to ``module.py``.

Every ``import`` / ``from ... import`` of every module under ``radio_lit/`` counts, wherever it
stands (top level, inside a function, under ``TYPE_CHECKING``): a function-level import is
still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[2] / "radio_lit"
#: Layers below the training module: they take what they need as arguments (DESIGN.md).
LOWER = (
    "students",
    "teachers",
    "normalizers",
    "losses",
    "data",
    "grid",
    "partitions",
    "metrics",
    "export",
    "optim",
    "step",
    "per_teacher",
    "cache",
)


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


def test_no_import_circle():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, f"import circles in radio_lit: {cycles[:5]}"


def test_lower_layers_never_import_the_training_module():
    graph = import_graph()
    lower = [n for n in graph if n.split(".")[1:2] and n.split(".")[1] in LOWER]
    offenders = {n: sorted(graph.successors(n)) for n in lower if "radio_lit.module" in graph[n]}
    assert not offenders, f"lower layers importing radio_lit.module: {offenders}"
    assert nx.has_path(graph, "radio_lit.cli", "radio_lit.module")  # the graph sees imports
