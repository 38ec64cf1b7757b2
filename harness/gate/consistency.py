"""A record judged against itself before the gate believes it: a record says what it
measured (errors, ratios, tolerances as fields, times) and what it concluded (status,
verdicts). Where the two disagree, the record cannot be trusted, whatever it concludes:
a check marked `pass` at a million times its tolerance, a run `ok` with no metrics or no
checks, a time per step that is NaN or negative."""

from __future__ import annotations

import math

from harness.core.registry import ORACLE, CheckVerdict
from harness.records.schema import CheckRecord, Record

# How far a recorded ratio may stand from error / allowed, where both are recorded: the
# two are written from the same floats, so only the rounding of one division separates them.
RATIO_RTOL = 1e-9


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def check_problems(check: CheckRecord) -> list[str]:
    """Where a check's verdict contradicts its own measurements."""
    name = f"check {check.name} vs {check.against}"
    problems = []
    for field in ("max_abs_error", "max_rel_error", "ratio"):
        value = getattr(check, field)
        if value is not None and (math.isnan(value) or value < 0):
            problems.append(f"{name}: {field} is {value}")
    if check.verdict == CheckVerdict.PASS and check.ratio is not None and not check.ratio <= 1:
        problems.append(f"{name}: marked pass at {check.ratio:.3g}x its tolerance")
    bound = check.bound
    if bound is None or check.verdict == CheckVerdict.SKIPPED:
        return problems
    if bound.factor is not None and None not in (bound.spread, bound.floor, bound.allowed):
        expected = bound.factor * bound.spread + bound.floor
        if not math.isclose(bound.allowed, expected, rel_tol=RATIO_RTOL, abs_tol=0.0):
            problems.append(f"{name}: allowed {bound.allowed:.6g} is not factor * spread + floor = {expected:.6g}")
    if bound.measure in ("max_abs", "relative") and _finite(check.max_abs_error) and _finite(bound.allowed) and bound.allowed > 0:
        measured = check.max_abs_error / bound.allowed
        if check.ratio is None or not math.isclose(check.ratio, measured, rel_tol=RATIO_RTOL, abs_tol=0.0):
            problems.append(f"{name}: ratio {check.ratio} is not its error over its tolerance ({measured:.6g})")
        if check.verdict == CheckVerdict.PASS and check.max_abs_error > bound.allowed:
            problems.append(f"{name}: marked pass with an error of {check.max_abs_error:.3g} over {bound.allowed:.3g} allowed")
    return problems


def record_problems(record: Record) -> list[str]:
    """Where a record contradicts itself; empty when it is consistent."""
    problems = []
    if record.status == "ok":
        if record.metrics is None:
            problems.append("status ok without metrics")
        if record.timings is None and record.read_from is None:
            problems.append("status ok without timings")
        if not record.checks and record.framework != ORACLE:
            problems.append("status ok without a single check")
        if record.artifacts is None:
            problems.append("status ok without its artifact")
    timings = record.timings
    if timings is not None:
        for field in ("per_step_s", "train_s", "transfer_s", "warmup_s", "data_prep_s", "train_s_spread"):
            value = getattr(timings, field)
            if not (_finite(value) and value >= 0):
                problems.append(f"timings.{field} is {value}")
        if not timings.per_step_s > 0 and record.status == "ok":
            problems.append(f"timings.per_step_s is {timings.per_step_s}")
        if any(not (_finite(t) and t >= 0) for t in timings.train_s_each):
            problems.append("timings.train_s_each holds a value that is not a time")
    if record.metrics is not None:
        values = [record.metrics.final_loss, *record.metrics.values.values()]
        if record.status == "ok" and not all(_finite(v) for v in values):
            problems.append("status ok with a final metric that is not finite")
    for check in record.checks:
        problems.extend(check_problems(check))
    return problems
