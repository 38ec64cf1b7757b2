"""The plan of a spec's matrix: which runs it takes (the chosen cells in each mode, the
calibration run and the oracle), which of them share a process, the calibration members
and the float64 twins. Nothing runs here."""

from __future__ import annotations

import functools
from dataclasses import replace

from adapters.protocol import ComputesScheduleRates
from harness.core import registry
from harness.core.registry import CALIBRATION, CALIBRATION_KEY, EAGER, FLOAT32, ORACLE, ORACLE_KEY, STRICT, TF32, RunKey, runs_on
from harness.inputs.members import reordered
from harness.inputs.problem import Problem, truncated


def matrix_keys(frameworks: list[str], devices: list[str], tf32: bool = False, modes: tuple[str, ...] = (EAGER,)) -> list[RunKey]:
    """The chosen cells in each mode, each framework on the devices it runs on (and with
    `tf32`, each framework again on the GPU with TF32 allowed), plus the calibration run
    (numpy@cpu) and the oracle, which the checks need, both eager; the oracle runs last, as
    it is the slowest."""
    keys = [RunKey(f, d, mode=m) for m in modes for d in devices for f in frameworks if runs_on(f, d)]
    if tf32 and "gpu" in devices:
        keys += [RunKey(f, "gpu", precision=TF32, mode=m) for m in modes for f in frameworks if runs_on(f, "gpu")]
    if CALIBRATION_KEY not in keys:
        keys.append(CALIBRATION_KEY)
    keys.append(ORACLE_KEY)
    return keys


def alternation_groups(keys: list[RunKey]) -> list[list[RunKey]]:
    """The keys that differ only in mode, together, in order of first appearance: their
    repeats take turns in one process (harness bench). Every other key is a group of one."""
    groups: dict[RunKey, list[RunKey]] = {}
    for key in keys:
        groups.setdefault(replace(key, mode=EAGER), []).append(key)
    return list(groups.values())


def member_seeds(problem: Problem, dtype: str = FLOAT32, upto: int | None = None) -> list[tuple[RunKey, int]]:
    """The calibration members' keys and seeds: the array-module code on the problem with
    its sums in another order (members.reordered), each with its own seed. float32: the
    envelope's members (long_run.members, whole runs); float64: math parity's
    (math_parity.members, the oracle's code over the twins' first steps). With `upto`, the
    members after those, up to that many in all (the envelope's second look)."""
    if dtype == FLOAT32:
        count, framework = problem.spec.checks.long_run.members, CALIBRATION
    else:
        count, framework = problem.spec.checks.math_parity.members, ORACLE
    seeds = range(count + 1, upto + 1) if upto is not None else range(1, count + 1)
    return [(RunKey(framework, "cpu", f"order{i}"), i) for i in seeds]


def calibration_members(problem: Problem, dtype: str = FLOAT32, upto: int | None = None) -> list[tuple[RunKey, Problem]]:
    """The calibration members (member_seeds, `upto` as there), each with its problem."""
    return [(key, reordered(problem, seed=seed)) for key, seed in member_seeds(problem, dtype, upto)]


def library_problem(problem: Problem, formula) -> Problem:
    """The problem as a library computes it where its formula differs from the spec's and
    the oracle can compute the library's exactly (harness/known_differences.yaml,
    `formula`): its clipping eps, its SGD dampening, the variance its batch norm stores.
    The oracle on it is the reference of that library's float64 twin."""
    doc = problem.spec.model_dump()
    if formula.dampening is not None and "dampening" in doc["optimizer"] and doc["optimizer"].get("momentum"):
        doc["optimizer"]["dampening"] = formula.dampening
    if formula.running_var is not None:
        for layer in doc["model"]["layers"]:
            if layer.get("kind") == "batch_norm":
                layer["running_var"] = formula.running_var
    spec = type(problem.spec).model_validate(doc)
    rates = formula.rates if isinstance(formula.rates, tuple) else None
    if formula.rates is not None and rates is None:
        raise ValueError(f"library_problem: the rates of {formula.rates!r} were not computed (plan.resolved)")
    return replace(
        problem,
        spec=spec,
        clip_eps=formula.clip_eps or 0.0,
        rates=rates,
        float32_corrections=formula.bias_corrections == "float32",
        sequential_loss=formula.loss_sum == "sequential",
    )


def resolved(formula, problem: Problem):
    """A library formula with what it names computed: `rates: optax` becomes the learning
    rate of every update of the run as optax's schedule gives it (adapters/jax_adapter.py
    schedule_rates, in this process, once per spec), a sequence of numbers the worker's
    oracle takes as they are. None stays None."""
    if formula is None or formula.rates is None or isinstance(formula.rates, tuple):
        return formula
    opt = problem.spec.optimizer
    if opt.schedule is None:
        return formula.model_copy(update={"rates": None})
    steps = problem.spec.training.epochs * len(problem.bounds)  # the whole run's, in a twin's problem too
    return formula.model_copy(update={"rates": _optax_rates(opt.model_dump_json(), type(opt), steps)})


@functools.cache
def _optax_rates(optimizer: str, kind: type, steps: int) -> tuple[float, ...]:
    """optax's rates for an optimizer section (as JSON, so that it keys the cache), computed
    once per process: the twins' reference and every library member of a spec take the same."""
    adapter = registry.load("jax")
    if not isinstance(adapter, ComputesScheduleRates):
        raise TypeError("the jax adapter computes no schedule rates (adapters/protocol.py ComputesScheduleRates)")
    return tuple(adapter.schedule_rates(kind.model_validate_json(optimizer), steps))


def twin_keys(keys: list[RunKey]) -> list[RunKey]:
    """The float64 twin of every framework and device that runs strict float32."""
    twins = [k.twin for k in keys if k.framework != ORACLE and k.precision == STRICT and not k.variant]
    return list(dict.fromkeys(twins))


def twin_steps(problem: Problem) -> int:
    return min(problem.total_steps, problem.spec.checks.math_parity.steps)


def twin_problem(problem: Problem) -> Problem:
    """The problem the float64 twins, the oracle's first steps and math parity's members
    train: its first `twin_steps` steps."""
    return truncated(problem, twin_steps(problem))
