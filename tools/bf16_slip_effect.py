"""How far a bf16 slip moves a run by itself, against the bf16 envelope's tolerance (issue 86):
whether a slip the verdict does not catch is one it should. For each recipe of the family
(tools/recipe_family.py's draws N, SEED), the honest matrix with its bf16 cells, then JAX's
bf16 cell again with the slip (`moment-in-bf16`: AdamW's first moment in bfloat16, optax's
mu_dtype); prints, per recipe, the largest relative move of the loss curve from the honest
JAX bf16 run's, over the loss curve check's tolerance (factor * e(t) + its floor, e(t) the
envelope's), and the honest check's ratio. Above 1 the slip is effective: it moves the run
past bf16's own spread, and the verdict should catch it.

    python tools/bf16_slip_effect.py N SEED [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
import recipe_family  # noqa: E402

from harness.core.registry import BF16, RunKey  # noqa: E402
from harness.inputs.problem import build_problem  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.verdict.checks import envelope  # noqa: E402

JAX, JAX_BF16 = RunKey("jax", "cpu"), RunKey("jax", "cpu", precision=BF16)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    args = parser.parse_args(argv)
    for i, doc in enumerate(recipe_family.drawn(args.n, args.seed)):
        result = recipe_family.judged(doc, args.data_dir, ("float32", "bf16"))
        honest, float32 = result.outcomes[JAX_BF16].losses, result.outcomes[JAX].losses
        loaded = recipe_family.loaded_recipe(doc)
        undo = recipe_family.moment_in_bf16()
        try:
            slipped = run(build_problem(loaded, args.data_dir), JAX_BF16).losses
        finally:
            undo()
        tolerance = envelope(loaded.spec, result.calibration.bf16)  # the loss curve check's, per step
        n = min(len(honest), len(slipped), len(tolerance))
        ratio = np.abs(slipped[:n] - honest[:n]) / np.abs(float32[:n]) / tolerance[:n]
        check = next(c for c in result.checks if (c.a, c.b, c.name) == (JAX_BF16, JAX, "loss_curve_envelope"))
        row = {"i": i, "slip_over_tolerance": round(float(ratio.max()), 3), "at_step": int(ratio.argmax())}
        print(json.dumps({**row, "honest_ratio": round(check.ratio, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
