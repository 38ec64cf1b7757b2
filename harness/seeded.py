"""A matrix's cells again at other seeds, for the verdict over seeds (harness/verdict/seeds.py,
`harness run --seeds N`): seed 0 is the spec's own (the matrix's runs), and each further seed
draws the initial weights and the batch order from the spec's own seeds and its number
(NumPy's SeedSequence), the same draw for every cell. Only the frameworks' own float32 or
bf16 cells run again, each in its adapter's kept process, with no twin, and beside them one
calibration member of each pair's reference (the yardstick of where rounding alone parts
runs: harness/verdict/seeds.py Horizons): a verdict over seeds compares the runs' final
metrics and where their loss curves part, and needs no tolerance calibrated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from rich.console import Console

from harness.calibrate import roles
from harness.core.registry import BF16, EAGER, FLOAT32, FLOAT64, STRICT, RunKey
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


def yardsticks(loaded: LoadedSpec, problem: Problem, keys: Sequence[RunKey]) -> dict[RunKey, jobs.Job]:
    """Each pair's yardstick, by the pair's run: the first calibration member of its
    precision standing for the run's library, the same training rounded otherwise. float32:
    the scheme's code (its sums in another order) computing the library's catalogued
    behaviours where it has some (roles.library32_jobs: optax's bias corrections in float32
    start a JAX run apart from torch's by more than rounding does), plain where none;
    bf16: torch's autocast, rounding where XLA:CPU rounds for a JAX run (roles.bf16_jobs).
    No yardstick for another precision or mode."""
    scheme = roles.scheme_of(problem)
    first = roles.member_seeds(problem, FLOAT32, scheme=scheme, part=roles.FIRST)[:1]
    plain = roles.member_jobs(loaded, problem, first)[0]
    order = plain.keys[0].variant
    library = {roles.library32_framework(j.keys[0]): j for j in roles.library32_jobs(loaded, problem, list(keys), scheme, part=roles.FIRST)}
    library = {f: j for f, j in library.items() if j.keys[0].variant.endswith(f"-{order}")}
    bf16 = {j.keys[0].variant: j for j in roles.bf16_jobs(loaded, problem, list(keys), scheme)}
    found = {}
    for run, _ in over.pairs(keys):
        if run.mode != EAGER:
            continue
        if run.precision == STRICT:
            found[run] = library.get(run.framework, plain)
        elif run.precision == BF16:
            found[run] = bf16.get(f"xla-{order}" if (run.framework, run.device) == ("jax", "cpu") else order)
    return {run: job for run, job in found.items() if job is not None}


def over_seeds(
    loaded: LoadedSpec,
    keys: Sequence[RunKey],
    n: int,
    built: Callable[[LoadedSpec], Problem],
    driver: Callable[[LoadedSpec, Problem], Callable],
    chosen: dict[RunKey, Outcome],
    console: Console,
    problem: Problem,
) -> tuple[list[Check], list]:
    """Each of `keys` at each of `n` seeds (seed 0: `chosen`, the matrix's own runs and
    members, the spec's `problem`), and each pair's yardstick (yardsticks), its problem
    `built` and its jobs run by `driver`'s (the matrix's executor), judged pair by pair: the
    checks over seeds, and their rows for the table (OverSeeds, Horizons)."""
    draws = drawn(loaded, n)
    sticks = yardsticks(loaded, problem, keys)
    extra = {j.keys[0]: j for j in sticks.values()}
    wanted = [*keys, *extra]
    outcomes: dict[RunKey, list[Outcome | None]] = {k: [] for k in wanted}
    for i, (init_seed, shuffle_seed) in enumerate(draws):
        again = loaded if i == 0 else reseeded(loaded, init_seed, shuffle_seed)
        done = {k: chosen[k] for k in wanted if i == 0 and k in chosen}  # seed 1's: the matrix's own runs
        missing = [k for k in wanted if k not in done]
        if missing:
            if i > 0:
                console.print(f"  {loaded.name}: seed {i + 1} of {n} (init {init_seed}, batch order {shuffle_seed})", highlight=False)
            seeded = built(again) if i > 0 else problem
            planned = [_job(k, i, loaded.name, seeded, extra.get(k)) for k in missing]
            ran = driver(again, seeded)(planned)
            done.update({k: ran.get(job.name, {}).get(k) for job, k in zip(planned, missing)})
        for k in wanted:
            outcomes[k].append(done.get(k))
    seeds = [seed for seed, _ in draws]
    by_run = {run: job.keys[0] for run, job in sticks.items()}
    rows = over.rows_of(keys, seeds, {k: [_final(o) for o in runs] for k, runs in outcomes.items()}, by_run)
    rows += _horizons(keys, by_run, seeds, outcomes)
    return over.judged(rows), rows


def _job(key: RunKey, i: int, name: str, problem: Problem, stick: jobs.Job | None) -> jobs.Job:
    """A seed's run of a cell, or of a yardstick (`stick`, its member's seed and formula)."""
    labels = ((key, f"{name} {key.label} seed {i}"),)
    cost = jobs.cost(key, problem.total_steps)
    if stick is not None:
        return replace(stick, name=f"{key.label} seed {i}", role=SEEDED, labels=labels, cost=cost, recorded=False, own_process=False)
    return jobs.Job(f"{key.label} seed {i}", SEEDED, labels, cost=cost, recorded=False, own_process=False)


def _horizons(keys, sticks: dict, seeds: list[int], outcomes: dict) -> list[over.Horizons]:
    """Each pair whose run has a yardstick (`sticks`, by the pair's run): where its loss
    curves part, seed by seed, beside where the reference's and the yardstick's part."""

    def curve(outcome: Outcome | None):
        return None if outcome is None or outcome.status != "ok" else outcome.losses

    rows = []
    for run, reference in over.pairs(keys):
        stick = sticks.get(run)
        if stick is None:
            continue
        rtol = over.horizon_rtol(reference)
        ours = [over.horizon(curve(a), curve(b), rtol) for a, b in zip(outcomes[run], outcomes[reference])]
        theirs = [over.horizon(curve(a), curve(b), rtol) for a, b in zip(outcomes[stick], outcomes[reference])]
        rows.append(over.Horizons(run, reference, stick, tuple(seeds), tuple(ours), tuple(theirs), rtol))
    return rows


def _final(outcome: Outcome | None) -> dict[str, float]:
    """A run's final metrics on the whole sets; none where it failed or was skipped."""
    if outcome is None or outcome.status != "ok":
        return {}
    return {name: float(value) for name, value in outcome.metrics.items()}
