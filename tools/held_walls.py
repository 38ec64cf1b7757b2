"""The wall time of harness.check_port on the README's example port (examples/
test_port_example.py), as a user's Python process pays it: once in fresh processes, then
three times and its slip once inside harness.held_processes (docs/measurements.md, "Held
processes"). Prints each call's seconds and whether its checks are the fresh call's, bitwise.

    python tools/held_walls.py
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
import test_port_example as example  # noqa: E402

import harness  # noqa: E402


def checks(verdict):
    return sorted((c.name, c.a.label, c.b.label, c.verdict.value, c.ratio, c.max_rel_error) for r in verdict.results for c in r.checks)


def timed(flax_model):
    began = time.perf_counter()
    verdict = harness.check_port(example.torch_model, flax_model, example.torch_to_flax, **example.SETUP)
    return verdict, time.perf_counter() - began


if __name__ == "__main__":
    fresh, seconds = timed(example.flax_model)
    print(f"fresh processes: {seconds:.1f} s, passed {fresh.passed}", flush=True)
    with harness.held_processes():
        for i in range(3):
            verdict, seconds = timed(example.flax_model)
            same = checks(verdict) == checks(fresh)
            print(f"held, call {i + 1}: {seconds:.1f} s, passed {verdict.passed}, the fresh call's checks {same}", flush=True)
        verdict, seconds = timed(example.flax_model_with_flax_epsilon)
        print(f"held, the slip: {seconds:.1f} s, {[(f.diagnosis, f.module) for f in verdict.failures][:1]}", flush=True)
