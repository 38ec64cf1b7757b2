"""The family aimed at one recipe (issue 56): MNIST MLPs trained as people train them today,
AdamW with global-norm clipping, a warmup-cosine schedule and label smoothing, on the real
MNIST test-set files. Draws N specs from SEED (NumPy's generator: widths, rates, decay,
clipping, smoothing, schedule, batch, epochs, the initial weights' and batch order's seeds),
runs the slice [A, B) of them (torch and JAX on the CPU, with the oracle, its members and
the twins, in this process) and appends one JSON line per spec to OUT: its checks' counts,
the failing checks with their diagnosis and the step they start at, the known entries, the
worst passing ratio, seconds. Specs already in OUT are skipped, so a stopped run goes on.
With `--precisions float32,bf16` each spec has its bf16 cells too (issue 86), and each row
lists their failing checks apart (`bf16_failed`); `--slip loss-in-bf16` runs JAX's bf16 cell
with its loss on the bfloat16 logits (flax#677's slip), `--slip moment-in-bf16` with AdamW's
first moment accumulated in bfloat16 (optax's mu_dtype), to measure that each is caught.

    python tools/recipe_family.py N SEED A B OUT.jsonl [--data-dir DIR] [--precisions LIST] [--slip loss-in-bf16|moment-in-bf16] [--frameworks LIST]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from rich.console import Console  # noqa: E402

from harness.core.registry import BF16, CheckVerdict  # noqa: E402
from harness.execute.plan import matrix_keys  # noqa: E402
from harness.inputs.problem import build_problem  # noqa: E402
from harness.matrix import run_cells  # noqa: E402
from harness.spec.load import LoadedSpec, validate_document  # noqa: E402

BASE = ROOT / "specs" / "mnist_adamw.yaml"
TRAIN = 8000  # the test-set source's training rows


def drawn(n: int, seed: int) -> list[dict]:
    """N specs of the recipe: mnist_adamw's data section on its test-set source, the rest drawn."""
    base = yaml.safe_load(BASE.read_text())
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(n):
        hidden = [int(rng.choice([32, 48, 64]))]
        if rng.random() < 0.3:
            hidden.append(int(rng.choice([16, 32])))
        batch = int(rng.choice([128, 256]))
        drop = bool(rng.random() < 0.5)
        epochs = int(rng.choice([2, 3]))
        per_epoch = TRAIN // batch if drop else -(-TRAIN // batch)
        total = per_epoch * epochs
        warmup = int(rng.integers(10, 60))
        doc = {
            "name": "recipe",
            "title": "an AdamW recipe on MNIST",
            "article": "tools/recipe_family.py",
            "data": {**base["data"], "source": "test-set", "split_seed": int(rng.integers(0, 1000))},
            "model": {"input_width": 784, "layers": [{"width": w, "activation": "relu"} for w in hidden] + [{"width": 10, "activation": "identity"}]},
            "init": {"weights": "torch_linear_default", "biases": "torch_linear_default", "seed": int(rng.integers(0, 2**31))},
            "loss": {"kind": "cross_entropy", "reduction": "mean", "label_smoothing": float(rng.choice([0.05, 0.1, 0.2]))},
            "optimizer": {
                "kind": "adamw",
                "lr": float(rng.choice([1e-3, 3e-3, 1e-2])),
                "weight_decay": float(rng.choice([1e-4, 1e-2, 0.1])),
                "clip_global_norm": float(rng.choice([0.5, 1.0, 2.0])),
                "schedule": {
                    "kind": "warmup_cosine",
                    "warmup_steps": warmup,
                    "decay_steps": int(rng.integers(warmup + 10, total + 20)),
                    "init_fraction": 0.0,
                    "end_fraction": float(rng.choice([0.0, 0.01, 0.05])),
                },
            },
            "training": {
                "epochs": epochs,
                "batch_size": batch,
                "shuffle": True,
                "shuffle_seed": int(rng.integers(0, 1000)),
                "last_batch": "drop" if drop else "keep",
            },
            "logging": {"loss_every": 1, "print_every": 1000},
            "timing": {"repeats": 1},
        }
        found.append(doc)
    return found


def loaded_recipe(doc: dict) -> LoadedSpec:
    """A drawn recipe as a loaded spec, its full profile."""
    spec, overrides = validate_document(Path("<recipe>"), doc)
    sha = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return LoadedSpec(spec=spec, path=Path("<recipe>"), sha256=sha, profile="full", overrides=overrides)


def judged(doc: dict, data_dir: Path, precisions: tuple[str, ...] = ("float32",), frameworks: tuple[str, ...] = ("torch", "jax")):
    loaded = loaded_recipe(doc)
    keys = matrix_keys(list(frameworks), ["cpu"], precisions=precisions)
    return run_cells(loaded, build_problem(loaded, data_dir), keys, None, Console(file=io.StringIO(), width=300))


def moment_in_bf16():
    """The JAX bf16 cell's AdamW with its first moment accumulated in bfloat16 (optax's
    mu_dtype), the float32 cells' as they are (tests/test_bf16.py makes the same slip); the
    function that undoes it returned."""
    import jax.numpy as jnp

    from adapters import jax_adapter

    build, rule = jax_adapter.build, jax_adapter.OPTIMIZERS["adamw"]

    def slipped(optax, lr, o):
        return optax.adamw(lr, b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay, mu_dtype=jnp.bfloat16)

    def in_bf16(problem, data, key):
        jax_adapter.OPTIMIZERS["adamw"] = slipped if key.precision == BF16 else rule
        try:
            return build(problem, data, key)
        finally:
            jax_adapter.OPTIMIZERS["adamw"] = rule

    jax_adapter.build = in_bf16
    return lambda: setattr(jax_adapter, "build", build)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", type=int)
    parser.add_argument("seed", type=int)
    parser.add_argument("a", type=int)
    parser.add_argument("b", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data" / "mnist")
    parser.add_argument("--precisions", default="float32")
    parser.add_argument("--slip", choices=["loss-in-bf16", "moment-in-bf16"])
    parser.add_argument("--frameworks", default="torch,jax", help="the frameworks run, numpy among them for its own cells (default torch,jax)")
    args = parser.parse_args(argv)
    if args.slip == "loss-in-bf16":
        from adapters import jax_probes

        jax_probes.loss_input = lambda out, dtype, compute: out  # the bf16 logits as they are
    if args.slip == "moment-in-bf16":
        moment_in_bf16()
    docs = drawn(args.n, args.seed)
    done = {json.loads(line)["i"] for line in args.out.read_text().splitlines() if line} if args.out.exists() else set()
    for i in range(args.a, min(args.b, len(docs))):
        if i in done:
            continue
        began = time.time()
        row = {"i": i, "seed": args.seed, "spec": docs[i]}
        try:
            result = judged(docs[i], args.data_dir, tuple(args.precisions.split(",")), tuple(args.frameworks.split(",")))
            checks = result.checks
            row["counts"] = {v.value: sum(c.verdict == v for c in checks) for v in CheckVerdict}
            row["failed"] = [(c.name, c.a.label, c.b.label, c.ratio, c.diagnosis[:400]) for c in checks if c.verdict == CheckVerdict.FAIL]
            row["bf16_failed"] = [f for f in row["failed"] if "+bf16" in f[1] + f[2]]
            row["known"] = sorted({c.diagnosis.split("(")[1].split(",")[0] for c in checks if c.verdict == CheckVerdict.KNOWN and "(" in c.diagnosis})
            passing = [c for c in checks if c.verdict == CheckVerdict.PASS and c.ratio is not None]
            worst = max(passing, key=lambda c: c.ratio, default=None)
            row["worst_pass"] = worst.ratio if worst else 0
            row["worst_check"] = (worst.name, worst.a.label, worst.b.label) if worst else None
        except Exception:  # noqa: BLE001 - a draw that raises is a row saying so
            row["error"] = traceback.format_exc()[-800:]
        row["s"] = round(time.time() - began, 1)
        with args.out.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(
            i,
            row.get("counts"),
            [(f[0], f[1], f[2], round(f[3] or 0, 2)) for f in row.get("failed", [])],
            row.get("worst_pass"),
            row.get("worst_check"),
            row.get("error", "")[-300:],
            row["s"],
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
