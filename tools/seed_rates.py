"""The verdict over seeds' rates (issue 86): runs peaks (or another committed spec) at seeds
SEED, SEED+1, ... (init and batch order both set to the seed), torch and JAX in float32,
JAX again at FACTOR times the learning rate, and the yardstick of the JAX pair's horizon
(harness/seeded.py yardsticks: the calibration member computing JAX's catalogued
behaviour), one JSON line per run in OUT (a stopped run goes on); then cuts the seeds every
cell finished into disjoint sets of 5, 10 and 20 and says how many sets each check over
seeds (harness/verdict/seeds.py: the final training loss, and where the loss curves part)
fails, honest (JAX against torch) and with the slip (JAX at FACTOR against torch).

    python tools/seed_rates.py SPEC N SEED OUT.jsonl [--factor 1.05] [--epochs 500] [--points 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import numpy as np  # noqa: E402

from harness import seeded  # noqa: E402
from harness.core.registry import CheckVerdict, RunKey  # noqa: E402
from harness.inputs.problem import build_problem  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.spec import load as spec_load  # noqa: E402
from harness.verdict import seeds  # noqa: E402

TORCH, JAX = RunKey("torch", "cpu"), RunKey("jax", "cpu")
YARDSTICK = RunKey("numpy", "cpu", "as-jax-order1")
CELLS = (("torch", 1.0), ("jax", 1.0), ("jax", "factor"), ("yardstick", 1.0))


def _loaded(args, seed: int, factor: float = 1.0):
    extra = {"init": {"seed": seed}, "training": {"shuffle_seed": seed, "epochs": args.epochs}, "data": {"points_per_axis": args.points}}
    path = ROOT / "specs" / f"{args.spec}.yaml"
    if factor != 1.0:
        extra["optimizer"] = {"lr": spec_load.load_spec(path).spec.optimizer.lr * factor}
    return spec_load.load_spec(path, extra=extra)


def measured(args) -> None:
    done = {(r["seed"], r["fw"], r["factor"]) for r in map(json.loads, args.out.read_text().splitlines())} if args.out.exists() else set()
    with args.out.open("a") as out:
        for seed in range(args.seed, args.seed + args.n):
            for framework, factor in CELLS:
                factor = args.factor if factor == "factor" else factor
                if (seed, framework, factor) in done:
                    continue
                loaded = _loaded(args, seed, factor)
                problem = build_problem(loaded)
                began = time.time()
                if framework == "yardstick":
                    job = seeded.yardsticks(loaded, problem, [TORCH, JAX])[JAX]
                    outcome = run(job.problem(problem), job.keys[0])
                else:
                    outcome = run(problem, RunKey(framework, "cpu"))
                row = {"seed": seed, "fw": framework, "factor": factor, "status": outcome.status, "metrics": outcome.metrics}
                row["losses"] = None if outcome.losses is None else [float(v) for v in outcome.losses]
                row["s"] = time.time() - began
                out.write(json.dumps(row) + "\n")
                out.flush()


def rates(args) -> None:
    by: dict[tuple[str, float], dict[int, dict]] = {}
    for r in map(json.loads, args.out.read_text().splitlines()):
        by.setdefault((r["fw"], r["factor"]), {})[r["seed"]] = r
    torch, jax, slipped, stick = by[("torch", 1.0)], by[("jax", 1.0)], by[("jax", args.factor)], by[("yardstick", 1.0)]
    common = sorted(set(torch) & set(jax) & set(slipped) & set(stick))
    print(f"{len(common)} seeds, {common[0]} to {common[-1]}")
    rtol = seeds.horizon_rtol(JAX)

    def curve(r):
        return None if r["status"] != "ok" or r["losses"] is None else np.asarray(r["losses"])

    def rows(side, chosen):
        def loss(runs):
            return tuple(runs[i]["metrics"].get("train_loss", np.nan) for i in chosen)

        final = seeds.OverSeeds("train_loss", JAX, TORCH, tuple(chosen), loss(side), loss(torch), YARDSTICK, loss(stick))
        ours = tuple(seeds.horizon(curve(side[i]), curve(torch[i]), rtol) for i in chosen)
        theirs = tuple(seeds.horizon(curve(stick[i]), curve(torch[i]), rtol) for i in chosen)
        return [final, seeds.Horizons(JAX, TORCH, YARDSTICK, tuple(chosen), ours, theirs, rtol)]

    for size in (5, 10, 20):
        sets = [common[i : i + size] for i in range(0, len(common) - size + 1, size)]
        if not sets:
            continue
        for name, side in (("honest, jax against torch", jax), (f"jax at {args.factor}x the rate", slipped)):
            judged = [seeds.judged(rows(side, s)) for s in sets]
            counts = ", ".join(f"{c.name} {sum(j[k].verdict == CheckVerdict.FAIL for j in judged)}" for k, c in enumerate(judged[0]))
            print(f"{size} seeds, {name}: of {len(sets)} disjoint sets, failing: {counts}")
    for name, side in (("honest", jax), ("slip", slipped)):
        for check in seeds.judged(rows(side, common)):
            print(f"all {len(common)} seeds, {name}: {check.name} {check.verdict.value} at {check.ratio:.2f}: {check.reason}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("n", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--factor", type=float, default=1.05)
    parser.add_argument("--epochs", type=int, default=500)
    parser.add_argument("--points", type=int, default=50)
    args = parser.parse_args(argv)
    measured(args)
    rates(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
