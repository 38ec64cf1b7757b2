"""Cross-host rows: a run made at several places (harness/execute/hosts.py) judged against the
matrix's own, one row per run: bitwise identical or not, how far apart, and the verdict of
the calibrated float32 rule (harness.verdict.rules.pair_checks) with its diagnosis."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from harness.calibrate.spread import Calibration
from harness.core.registry import RunKey
from harness.execute.hosts import is_copy
from harness.execute.jobs import Job
from harness.run.runner import Outcome
from harness.spec.model import Spec
from harness.verdict import diagnosis
from harness.verdict.rules import pair_checks


@dataclass(frozen=True)
class CrossHost:
    """One run's bits on two places."""

    key: RunKey
    first: str  # the place of the matrix's own run
    other: str
    hosts: tuple[str, str]  # the workers' host names (and Ray nodes)
    bitwise_identical: bool | None  # None: one of them did not finish
    max_abs_diff: float | None
    first_diff_step: int | None
    verdict: str  # pass, fail, known, skipped (the calibrated rule's, worst of its checks)
    diagnosis: str | None


def _host(outcome: Outcome) -> str:
    worker = outcome.worker or {}
    node = f" node {worker['node']}" if worker.get("node") else ""
    return f"{worker.get('hostname', '?')}{node}"


def _apart(a: Outcome, b: Outcome) -> tuple[bool, float, int | None]:
    this = np.concatenate([a.losses, *(np.ravel(v) for v in a.final_params.values())])
    that = np.concatenate([b.losses, *(np.ravel(v) for v in b.final_params.values())])
    if this.shape != that.shape:
        return False, float("inf"), 0
    if np.array_equal(this, that, equal_nan=True):
        return True, 0.0, None
    differs = np.flatnonzero(a.losses != b.losses)
    return False, float(np.nanmax(np.abs(this - that))), int(differs[0]) if differs.size else len(a.losses)


def rows(spec: Spec, jobs: list[Job], done: dict, cal: Calibration) -> list[CrossHost]:
    """A row per run that ran at more than one place."""
    found = []
    primary = {c.name: c for c in jobs if c.place is not None and not is_copy(c)}
    for job in jobs:
        if not is_copy(job):
            continue
        first = primary[job.name.removesuffix(f" at {job.place}")]
        for key, other in done.get(job.name, {}).items():
            mine = done.get(first.name, {}).get(key)
            if mine is None or mine.status != "ok" or other.status != "ok":
                found.append(CrossHost(key, first.place, job.place, ("?", "?"), None, None, None, "skipped", "a run did not finish"))
                continue
            same, diff, step = _apart(mine, other)
            renamed = replace(other, key=replace(key, variant=f"at-{job.place.replace(':', '-')}"))
            # one library at two places: both runs carry its catalogued behaviours, so no
            # known difference explains what sets them apart (rounding, or a host's fault)
            checks = diagnosis.diagnose(spec, pair_checks(spec, renamed, mine, cal))
            failing = [c for c in checks if c.verdict in ("fail", "known")]
            verdict = "pass" if not failing else ("fail" if any(c.verdict == "fail" for c in failing) else "known")
            said = failing[0].diagnosis if failing else None
            found.append(CrossHost(key, first.place, job.place, (_host(mine), _host(other)), same, diff, step, verdict, said))
    return found
