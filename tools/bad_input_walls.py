"""The wall time of harness.check_port on the bad inputs that only the port's own code finds
(tests/test_port_api.py BAD_DATA: labels past the module's outputs, a converter naming a layer
flax does not have, 3-channel images for a 1-channel conv), as a user's Python process pays
it: each in fresh processes, then each inside harness.held_processes, cold (the first call)
and again (docs/measurements.md, "Bad inputs' walls"). Prints each call's seconds and the
error's type and first words.

    python tools/bad_input_walls.py
"""

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import harness  # noqa: E402
from tests.test_port_api import BAD_DATA, SETUP  # noqa: E402


def timed(case: str) -> str:
    callables, row, classes, _ = BAD_DATA[case]
    x = np.random.default_rng(0).standard_normal((256, *row)).astype(np.float32)
    began = time.perf_counter()
    try:
        harness.check_port(*callables, data={"train": (x, np.arange(256) % classes)}, **{**SETUP, "training": {"epochs": 1, "batch_size": 16}})
        said = "no error"
    except harness.SpecError as error:
        said = f"SpecError: {str(error)[:60]}"
    return f"{time.perf_counter() - began:.1f} s, {said}"


if __name__ == "__main__":
    for case in BAD_DATA:
        print(f"fresh processes, {case}: {timed(case)}", flush=True)
    with harness.held_processes():
        for case in BAD_DATA:
            print(f"held, first call, {case}: {timed(case)}", flush=True)
        for case in BAD_DATA:
            print(f"held, again, {case}: {timed(case)}", flush=True)
