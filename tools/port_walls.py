"""The wall time of harness.check_port on an example port (examples/<name>/: the residual
CNN, resnet_port; the hub examples, hub_gpt2 and hub_resnet, Hugging Face's own torch and
Flax modules, which need the `hub` extra), called as a user's script calls it with the
example's own sections, beside the training seconds of the frameworks' runs it judges
(torch@cpu's and jax@cpu's train_s) (docs/measurements.md). Run it once per example, in a
fresh process each: the first call's cost is the user's.

    HARNESS_DATA_DIR=... python tools/port_walls.py resnet_port|hub_gpt2|hub_resnet|...
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

TEXT = "/usr/share/common-licenses"  # Debian's licences, the text examples' data


def check(name: str) -> str:
    doc = yaml.safe_load((ROOT / "examples" / name / f"{name}.yaml").read_text())
    found = importlib.util.spec_from_file_location(name, ROOT / "examples" / name / f"{name}.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    sections = {k: doc[k] for k in ("data", "loss", "optimizer", "training", "checks") if k in doc}
    data_dir = TEXT if doc["data"]["kind"] == "text" else os.environ.get("HARNESS_DATA_DIR")
    began = time.perf_counter()
    verdict = harness.check_port(
        module.torch_model, module.flax_model, module.torch_to_flax, **sections, init_seed=doc["init"]["seed"],
        input_shape=doc["model"].get("input_shape"), data_dir=data_dir, name=name,
    )  # fmt: skip
    wall = time.perf_counter() - began
    runs = {k.label: o.timings.get("train_s") for r in verdict.results for k, o in r.outcomes.items() if k.label in ("torch@cpu", "jax@cpu")}
    trained = sum(s for s in runs.values() if s is not None)
    return f"{name}: wall {wall:.1f} s, frameworks' training {trained:.2f} s ({runs}), passed {verdict.passed}, {len(verdict.failures)} failures"


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(check(name), flush=True)
