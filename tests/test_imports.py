"""`import harness` and loading every spec import no framework (STYLE.md, point 3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

FRAMEWORKS = ("torch", "jax", "jaxlib", "flax", "cupy", "optax")

PROGRAM = f"""
import sys
import harness, harness.cli, harness.matrix, harness.verdict.checks, harness.records.schema
from harness.spec.load import load_spec, spec_paths
for path in spec_paths().values():
    load_spec(path)
loaded = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)
print(",".join(loaded))
"""


def test_import_harness_loads_no_framework():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_the_check_itself_can_fail():
    program = PROGRAM.replace("import harness,", "import numpy.linalg, json; import harness,").replace(f"{FRAMEWORKS!r}", "('json',)")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "json"


def test_the_report_module_imports_no_plotting_library():
    program = "import sys, harness.report.document, harness.cli; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def module_files() -> dict[str, Path]:
    """Every module of the project (harness and its subpackages, adapters), by dotted name."""
    found = {}
    for folder in ("harness", "adapters"):
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Every `import harness.x` / `from harness import x` / `from adapters...`, at module
    level or inside a function (or under TYPE_CHECKING), as an edge between modules."""
    import ast

    modules = module_files()
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
        graph[name] = {e for e in edges if e != name and not e.endswith(".__init__")}
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
    """harness.report.table renders records (with the report's row builders): it reaches neither
    the matrix nor the runner, directly or through another module."""
    graph = import_graph()
    assert "harness.report.rows" in graph["harness.report.table"]
    assert not {"harness.matrix", "harness.run.runner"} & reachable(graph, "harness.report.table")
    assert "harness.matrix" in reachable(graph, "harness.cli")  # the check can see an import


# The pipeline's rooms, in order: a module may import from its own room and the rooms
# before it, never from one after it (the adapters come after the reference math they
# share, and before the run that loads them by name).
PIPELINE = (
    "core",
    "layers",
    "optimizers",
    "spec",
    "inputs",
    "reference",
    "adapters",
    "run",
    "execute",
    "hardware",
    "calibrate",
    "verdict",
    "records",
    "report",
    "gate",
    "top",
)


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "adapters":
        return "adapters"
    return parts[1] if len(parts) > 2 else "top"


def backward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} -> {b}" for a, edges in graph.items() for b in edges if PIPELINE.index(room(b)) > PIPELINE.index(room(a))]


def test_no_room_imports_from_a_later_room_of_the_pipeline():
    graph = import_graph()
    assert {room(m) for m in graph} == set(PIPELINE)
    assert backward_imports(graph) == []
    # the check can fail: the records importing the top-level matrix runs back up
    graph["harness.records.store"].add("harness.matrix")
    assert backward_imports(graph) == ["harness.records.store -> harness.matrix"]


def test_the_readme_layout_names_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text()  # the README's Layout section, moved there (issue 55)
    for path in module_files().values():
        if not path.name.startswith("__"):
            shown = path.relative_to(ROOT).as_posix()
            assert f"`{shown}`" in layout, f"{shown} is not in docs/layout.md"


def test_no_module_is_over_500_lines():
    """Issue 53: no file over 500 lines in harness/ or adapters/ (split where one grows)."""
    long = {name: n for name, path in module_files().items() if (n := len(path.read_text().splitlines())) > 500}
    assert long == {}


# Names two ideas once shared (issue 84): each is now defined in one module of harness/ and adapters/.
ONE_IDEA = {"run_spec": "harness.api", "Verdict": "harness.result", "Spread": "harness.calibrate.spread"}


def test_the_apis_names_and_spread_are_each_defined_once():
    """The public run_spec (harness/api.py) beside the driver's, the API's Verdict beside the
    checks' verdict, and calibrate's Spread beside an autograd function: one name per idea."""
    import ast

    defined: dict[str, list[str]] = {name: [] for name in ONE_IDEA}
    for module, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in defined:
                defined[node.name].append(module)
    assert defined == {name: [module] for name, module in ONE_IDEA.items()}, defined
