"""`import harness` and loading every spec import no framework (STYLE.md, point 3)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

FRAMEWORKS = ("torch", "jax", "jaxlib", "cupy", "optax")

PROGRAM = f"""
import sys
import harness, harness.cli, harness.matrix, harness.checks, harness.records
from harness.spec import load_spec, spec_paths
for path in spec_paths().values():
    load_spec(path)
loaded = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)
print(",".join(loaded))
"""


def test_import_harness_loads_no_framework():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_the_check_itself_can_fail():
    program = PROGRAM.replace("import harness,", "import numpy.linalg, json; import harness,").replace(
        f"{FRAMEWORKS!r}", "('json',)"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "json"


def test_the_report_module_imports_no_plotting_library():
    program = "import sys, harness.report, harness.cli; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def import_graph() -> dict[str, set[str]]:
    """Every `import harness.x` / `from harness import x` / `from adapters...`, at module
    level or inside a function (or under TYPE_CHECKING), as an edge between modules."""
    import ast

    modules = {f"{p.parent.name}.{p.stem}": p for folder in ("harness", "adapters") for p in (ROOT / folder).glob("*.py")}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("harness", "adapters"):
                if node.module in modules:
                    edges.add(node.module)
                edges.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
        graph[name] = edges - {name, f"{name.split('.')[0]}.__init__"}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_no_import_cycle_among_the_projects_modules():
    import graphlib

    try:
        list(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_the_terminal_tables_render_records_not_the_matrix():
    """harness.table renders records (with the report's row builders): it reaches neither
    the matrix nor the runner, directly or through another module."""
    graph = import_graph()
    assert "harness.rows" in graph["harness.table"]
    assert not {"harness.matrix", "harness.runner"} & reachable(graph, "harness.table")
    assert "harness.matrix" in reachable(graph, "harness.cli")  # the check can see an import


def test_the_readme_layout_names_every_module():
    layout = (ROOT / "README.md").read_text().split("## Layout")[1].split("\n## ")[0]
    for folder in ("harness", "adapters"):
        for path in (ROOT / folder).glob("*.py"):
            if not path.name.startswith("__"):
                assert f"`{path.name}`" in layout, f"{folder}/{path.name} is not in the README's layout"
