"""A matrix's cells again at other seeds, for the verdict over seeds (harness/verdict/seeds.py,
`harness run --seeds N`): seed 0 is the spec's own (the matrix's runs), and each further seed
draws the initial weights and the batch order from the spec's own seeds and its number
(NumPy's SeedSequence), the same draw for every cell. Only the frameworks' own float32 or
bf16 cells run again, each in its adapter's kept process, with no member nor twin: a
verdict over seeds compares the runs' final metrics, and needs no tolerance calibrated."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from rich.console import Console

from harness.core.registry import FLOAT64, RunKey
from harness.execute import jobs
from harness.inputs.problem import Problem
from harness.run.runner import Outcome
from harness.spec.load import LoadedSpec
from harness.verdict import seeds as over
from harness.verdict.checks import Check

SEEDED = "a seed's run"  # the role of each further seed's job


def drawn(loaded: LoadedSpec, n: int) -> list[tuple[int, int]]:
    """The (init seed, batch-order seed) of each of `n` seeds, the spec's own first."""
    spec = loaded.spec
    own = (spec.init.seed, spec.training.shuffle_seed)
    states = np.random.SeedSequence(list(own)).spawn(n - 1)  # seed i the same whatever n
    return [own, *[tuple(int(v) for v in s.generate_state(2) >> 1) for s in states]]


def reseeded(loaded: LoadedSpec, init_seed: int, shuffle_seed: int) -> LoadedSpec:
    spec = loaded.spec
    init = spec.init.model_copy(update={"seed": init_seed})
    training = spec.training.model_copy(update={"shuffle_seed": shuffle_seed})
    return loaded.model_copy(update={"spec": spec.model_copy(update={"init": init, "training": training})})


def seeded_keys(keys: Sequence[RunKey], frameworks: Sequence[str]) -> list[RunKey]:
    """The cells a verdict over seeds runs again: the frameworks' own, not float64's."""
    return [k for k in keys if k.framework in frameworks and k.precision != FLOAT64]


def over_seeds(
    loaded: LoadedSpec,
    keys: Sequence[RunKey],
    n: int,
    built: Callable[[LoadedSpec], Problem],
    driver: Callable[[LoadedSpec, Problem], Callable],
    chosen: dict[RunKey, Outcome],
    console: Console,
) -> tuple[list[Check], list[over.OverSeeds]]:
    """Each of `keys` at each of `n` seeds (seed 0: `chosen`, the matrix's own runs), its
    problem `built` and its jobs run by `driver`'s (the matrix's executor), judged pair by
    pair: the checks over seeds, and their rows for the table."""
    draws = drawn(loaded, n)
    metrics: dict[RunKey, list[dict[str, float]]] = {k: [_final(chosen.get(k))] for k in keys}
    for i, (init_seed, shuffle_seed) in enumerate(draws[1:], start=1):
        console.print(f"  {loaded.name}: seed {i + 1} of {n} (init {init_seed}, batch order {shuffle_seed})", highlight=False)
        again = reseeded(loaded, init_seed, shuffle_seed)
        problem = built(again)
        planned = [
            jobs.Job(
                f"{k.label} seed {i}",
                SEEDED,
                ((k, f"{loaded.name} {k.label} seed {i}"),),
                cost=jobs.cost(k, problem.total_steps),
                recorded=False,
                own_process=False,
            )
            for k in keys
        ]
        done = driver(again, problem)(planned)
        for job, key in zip(planned, keys):
            metrics[key].append(_final(done.get(job.name, {}).get(key)))
    rows = over.rows_of(keys, [seed for seed, _ in draws], metrics)
    return over.judged(rows), rows


def _final(outcome: Outcome | None) -> dict[str, float]:
    """A run's final metrics on the whole sets; none where it failed or was skipped."""
    if outcome is None or outcome.status != "ok":
        return {}
    return {name: float(value) for name, value in outcome.metrics.items()}
