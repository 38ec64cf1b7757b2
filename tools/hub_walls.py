"""The wall time of harness.check_port on the hub examples (examples/hub_gpt2/,
examples/hub_resnet/: Hugging Face's own torch and Flax modules), from a script, beside the
training seconds of the frameworks' runs it judges (torch@cpu's and jax@cpu's train_s), in
fresh Python processes of their own each (docs/measurements.md). Needs the `hub` extra.

    python tools/hub_walls.py [hub_gpt2|hub_resnet ...]
"""

import importlib.util
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import harness  # noqa: E402

DATA_DIRS = {"hub_gpt2": "/usr/share/common-licenses", "hub_resnet": os.environ.get("HARNESS_DATA_DIR")}


def check(name: str) -> str:
    doc = yaml.safe_load((ROOT / "examples" / name / f"{name}.yaml").read_text())
    found = importlib.util.spec_from_file_location(name, ROOT / "examples" / name / f"{name}.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    sections = {k: doc[k] for k in ("data", "loss", "optimizer", "training")}
    began = time.perf_counter()
    verdict = harness.check_port(
        module.torch_model, module.flax_model, module.torch_to_flax, **sections, init_seed=doc["init"]["seed"],
        input_shape=doc["model"].get("input_shape"), data_dir=DATA_DIRS[name], name=name,
    )  # fmt: skip
    wall = time.perf_counter() - began
    runs = {k.label: o.timings.get("train_s") for r in verdict.results for k, o in r.outcomes.items() if k.label in ("torch@cpu", "jax@cpu")}
    trained = sum(s for s in runs.values() if s is not None)
    return f"{name}: wall {wall:.1f} s, frameworks' training {trained:.2f} s ({runs}), passed {verdict.passed}, {len(verdict.failures)} failures"


if __name__ == "__main__":
    for name in sys.argv[1:] or list(DATA_DIRS):
        print(check(name), flush=True)
