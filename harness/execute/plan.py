"""Which runs a matrix takes: the chosen jobs in each mode with the calibration run and
the oracle, which of them share a process (`framework_jobs`), and the float64 twins'
keys; the jobs calibration adds are harness/calibrate/roles.py's. Nothing runs here."""

from __future__ import annotations

from dataclasses import replace

from harness.core.registry import (
    BF16,
    BF16_MEMBER_KEY,
    CALIBRATION_KEY,
    EAGER,
    FLOAT32,
    GPU_CALIBRATION_KEY,
    GPU_ORACLE_KEY,
    ORACLE,
    ORACLE_KEY,
    PORT_FRAMEWORKS,
    PORT_MEMBER_KEY,
    PORT_REFERENCE_KEY,
    STRICT,
    TF32,
    RunKey,
    runs_on,
)
from harness.execute.jobs import FRAMEWORK, Job, cost
from harness.inputs.problem import Problem
from harness.spec.load import LoadedSpec

GPU_MIN_REPEATS = 2


def matrix_keys(
    frameworks: list[str],
    devices: list[str],
    tf32: bool = False,
    modes: tuple[str, ...] = (EAGER,),
    references: str = "cpu",
    precisions: tuple[str, ...] = (FLOAT32,),
) -> list[RunKey]:
    """The chosen jobs in each mode, each framework on the devices it runs on (and with
    `tf32`, each framework again on the GPU with TF32 allowed; with bf16 among `precisions`,
    each framework again in it, eager), plus the calibration run and the
    oracle, which the checks need, both eager, on the `references` device (numpy@cpu and
    oracle@cpu, or cupy@gpu and oracle@gpu); the oracle runs last, as it is the slowest."""
    keys = [RunKey(f, d, mode=m) for m in modes for d in devices for f in frameworks if runs_on(f, d)]
    if tf32 and "gpu" in devices:
        keys += [RunKey(f, "gpu", precision=TF32, mode=m) for m in modes for f in frameworks if runs_on(f, "gpu")]
    bf16 = [RunKey(f, d, precision=BF16) for d in devices for f in frameworks if runs_on(f, d)] if BF16 in precisions else []
    if bf16:  # with the bf16 envelope's own run, whose members calibrate them all (none where no cell is bf16's)
        keys += bf16
        if BF16_MEMBER_KEY not in keys:
            keys.append(BF16_MEMBER_KEY)
    member, oracle = (CALIBRATION_KEY, ORACLE_KEY) if references == "cpu" else (GPU_CALIBRATION_KEY, GPU_ORACLE_KEY)
    if member not in keys:
        keys.append(member)
    keys.append(oracle)
    return keys


def port_keys(keys: list[RunKey]) -> list[RunKey]:
    """The runs a port takes of those asked for (harness/calibrate/roles.py PORT_SCHEME):
    torch's and JAX's, never the array-module code nor the oracle (there is no array-module
    code of a user's model), with torch's float32 run on the CPU (its members' code) and
    torch's float64 run, the reference, last."""
    found = [k for k in keys if k.framework in PORT_FRAMEWORKS]
    if PORT_MEMBER_KEY not in found:
        found.append(PORT_MEMBER_KEY)
    return [*found, PORT_REFERENCE_KEY]


def alternation_groups(keys: list[RunKey]) -> list[list[RunKey]]:
    """The keys that differ only in mode, together, in order of first appearance: their
    repeats take turns in one process (harness bench). Every other key is a group of one."""
    groups: dict[RunKey, list[RunKey]] = {}
    for key in keys:
        groups.setdefault(replace(key, mode=EAGER), []).append(key)
    return list(groups.values())


def framework_jobs(loaded: LoadedSpec, problem: Problem, keys: list[RunKey], repeats: int | None) -> list[Job]:
    """The runs asked for as jobs: the keys of one framework and device together, their
    modes taking turns in one process, each repeated `repeats` times (the spec's by default)."""
    found = []
    for group in alternation_groups(keys):
        # The oracle's speed is nobody's question: it runs once. A GPU run is repeated at
        # least twice, so that run-to-run determinism on the device is measured.
        runs = 1 if group in ([ORACLE_KEY], [GPU_ORACLE_KEY], [PORT_REFERENCE_KEY]) else repeats or loaded.spec.timing.repeats
        if group[0].device == "gpu" and group[0].framework != ORACLE:
            runs = max(runs, GPU_MIN_REPEATS)
        labels = tuple((key, f"{loaded.name} {key.label}") for key in group)
        found.append(Job(group[0].label, FRAMEWORK, labels, runs, cost=sum(cost(k, problem.total_steps, runs) for k in group)))
    return found


def twin_keys(keys: list[RunKey]) -> list[RunKey]:
    """The float64 twin of every framework and device that runs strict float32."""
    twins = [k.twin for k in keys if k.framework != ORACLE and k.precision == STRICT and not k.variant]
    return list(dict.fromkeys(twins))
