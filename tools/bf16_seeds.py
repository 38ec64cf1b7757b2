"""A committed spec's quick profile at seeds never run before, with its bf16 cells (issue 86):
draws N (init, batch order, split) seeds from SEED (NumPy's generator), runs torch and JAX on
the CPU in float32 and bf16 through the Python API (harness.run_spec), and appends one JSON
line per draw to OUT: the seeds, the failing checks (gated or not) with their diagnosis, and
seconds. Draws already in OUT are skipped, so a stopped run goes on.

    python tools/bf16_seeds.py SPEC N SEED OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import harness  # noqa: E402


def drawn(spec: str, n: int, seed: int) -> list[dict]:
    """N copies of the spec, each with fresh seeds where it has them."""
    base = yaml.safe_load((ROOT / "specs" / f"{spec}.yaml").read_text())
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(n):
        doc = yaml.safe_load(yaml.safe_dump(base))
        doc["init"]["seed"] = int(rng.integers(0, 2**31))
        if "shuffle_seed" in doc["training"]:
            doc["training"]["shuffle_seed"] = int(rng.integers(0, 1000))
        if "split_seed" in doc["data"]:
            doc["data"]["split_seed"] = int(rng.integers(0, 1000))
        found.append(doc)
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("n", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    done = {json.loads(line)["i"] for line in args.out.read_text().splitlines() if line} if args.out.exists() else set()
    for i, doc in enumerate(drawn(args.spec, args.n, args.seed)):
        if i in done:
            continue
        began = time.time()
        verdict = harness.run_spec(doc, profile="quick", frameworks=["torch", "jax"], precisions=["float32", "bf16"])
        row = {
            "i": i,
            "spec": args.spec,
            "seeds": {"init": doc["init"]["seed"], "shuffle": doc["training"].get("shuffle_seed"), "split": doc["data"].get("split_seed")},
            "passed": verdict.passed,
            "failed": [(f.check, f.run, f.reference, f.gated, round(f.ratio or 0, 2), f.detail[:300]) for f in verdict.failures],
            "s": round(time.time() - began, 1),
        }
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(i, row["passed"], [(c, r, ref, g, x) for c, r, ref, g, x, _ in row["failed"]], row["s"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
