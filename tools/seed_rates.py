"""The verdict over seeds' rates (issue 86): runs peaks (or another committed spec) at seeds
SEED, SEED+1, ... (init and batch order both set to the seed), torch and JAX in float32 and
torch again at FACTOR times the learning rate, one JSON line per run in OUT (a stopped run
goes on); then cuts the seeds every cell finished into disjoint sets of 5, 10 and 20 and
says how many sets the verdict over seeds' rule (harness/verdict/seeds.py) fails, honest
(JAX against torch) and with the slip (torch at FACTOR against torch).

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
from harness.core.registry import CheckVerdict, RunKey  # noqa: E402
from harness.inputs.problem import build_problem  # noqa: E402
from harness.run.runner import run  # noqa: E402
from harness.spec import load as spec_load  # noqa: E402
from harness.verdict import seeds  # noqa: E402

TORCH, JAX = RunKey("torch", "cpu"), RunKey("jax", "cpu")


def measured(args) -> None:
    path = ROOT / "specs" / f"{args.spec}.yaml"
    done = {(r["seed"], r["fw"], r["factor"]) for r in map(json.loads, args.out.read_text().splitlines())} if args.out.exists() else set()
    base = spec_load.load_spec(path).spec.optimizer.lr
    with args.out.open("a") as out:
        for seed in range(args.seed, args.seed + args.n):
            for framework, factor in (("torch", 1.0), ("jax", 1.0), ("torch", args.factor)):
                if (seed, framework, factor) in done:
                    continue
                extra = {"init": {"seed": seed}, "training": {"shuffle_seed": seed, "epochs": args.epochs}, "data": {"points_per_axis": args.points}}
                if factor != 1.0:
                    extra["optimizer"] = {"lr": base * factor}
                began = time.time()
                outcome = run(build_problem(spec_load.load_spec(path, extra=extra)), RunKey(framework, "cpu"))
                row = {"seed": seed, "fw": framework, "factor": factor, "status": outcome.status, "metrics": outcome.metrics}
                row["s"] = time.time() - began
                out.write(json.dumps(row) + "\n")
                out.flush()


def rates(args) -> None:
    by: dict[tuple[str, float], dict[int, float]] = {}
    for r in map(json.loads, args.out.read_text().splitlines()):
        by.setdefault((r["fw"], r["factor"]), {})[r["seed"]] = r["metrics"].get("train_loss", float("nan"))
    torch, jax, slipped = by[("torch", 1.0)], by[("jax", 1.0)], by[("torch", args.factor)]
    common = sorted(set(torch) & set(jax) & set(slipped))
    print(f"{len(common)} seeds, {common[0]} to {common[-1]}")
    for size in (5, 10, 20):
        sets = [common[i : i + size] for i in range(0, len(common) - size + 1, size)]
        for name, side, key in (("honest, jax against torch", jax, JAX), (f"torch at {args.factor}x the rate", slipped, TORCH)):
            rows = [seeds.OverSeeds("train_loss", key, TORCH, tuple(s), tuple(side[i] for i in s), tuple(torch[i] for i in s)) for s in sets]
            fails = sum(seeds.judged([row])[0].verdict == CheckVerdict.FAIL for row in rows)
            print(f"{size} seeds, {name}: {fails} of {len(sets)} disjoint sets fail")
    reference = tuple(torch[i] for i in common)
    sides = ((jax, JAX), (slipped, TORCH))
    every = [seeds.OverSeeds("train_loss", k, TORCH, tuple(common), tuple(side[i] for i in common), reference) for side, k in sides]
    for name, row in zip(("honest", "slip"), every):
        ratio = row.ratio(seeds.SEEDS_ALPHA)
        print(f"all {row.n} seeds, {name}: mean difference {row.mean_difference:+.3g}, spread {row.spread:.3g}, ratio {ratio:.2f}")


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
