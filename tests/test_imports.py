"""`import harness` and loading every spec import no framework (STYLE.md, point 3)."""

from __future__ import annotations

import subprocess
import sys

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
