"""Agreement checks between runs of one spec, each with its measured error, its tolerance
and a verdict that can fail.

Short horizon: outputs and loss at step 0, parameters after the first step and after a
few steps, and the loss curve step by step, compare to float32 tolerances (allclose).

Long run: the envelope rule. The array-module code in float32 against the same code in
float64 (the oracle) measures how far float32 rounding alone carries this spec: e(t) for
the loss curve (relative, running maximum over steps) and e_out for the final outputs.
Any two runs may differ by at most factor * e + floor: the loss at step t relatively by
factor * e(t), each final metric relatively by factor * e(T), the final outputs
absolutely by factor * e_out. The
calibration pair itself cannot be judged by the rule it defines: its envelope checks are
skipped, with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from harness.inputs import Params
from harness.registry import CALIBRATION_KEY, ORACLE_KEY, STRICT, RunKey
from harness.runner import Outcome
from harness.spec import Close, KnownDifference, Spec

TINY = 1e-30


@dataclass(frozen=True)
class Check:
    name: str
    a: RunKey
    b: RunKey
    verdict: str  # pass, fail, known (an explained failure, see the spec), skipped
    tolerance: str
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    first_failure_step: int | None = None
    horizon_steps: int | None = None
    reason: str | None = None

    def involves(self, key: RunKey) -> bool:
        return key in (self.a, self.b)

    def other(self, key: RunKey) -> RunKey:
        return self.b if key == self.a else self.a


@dataclass(frozen=True)
class Calibration:
    curve: np.ndarray  # running maximum of the relative float32-vs-float64 loss distance
    outputs: float  # max |float32 - float64| of the final probe outputs
    runs: int  # how many float32 runs measured it


def _errors(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(b), TINY)
    return float(diff.max(initial=0.0)), float(rel.max(initial=0.0))


def _flat(params: Params) -> np.ndarray:
    return np.concatenate([np.concatenate([w.ravel(), b.ravel()]) for w, b in params])


def close_check(name: str, a: RunKey, b: RunKey, va: np.ndarray, vb: np.ndarray, tol: Close) -> Check:
    va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
    rule = f"|a-b| <= {tol.atol:g} + {tol.rtol:g}*|b|"
    if va.shape != vb.shape:
        return Check(name, a, b, "fail", rule, reason=f"shapes differ: {va.shape} vs {vb.shape}")
    max_abs, max_rel = _errors(va, vb)
    ok = bool(np.all(np.abs(va - vb) <= tol.atol + tol.rtol * np.abs(vb)))
    return Check(name, a, b, "pass" if ok else "fail", rule, max_abs, max_rel)


def relative_curve_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / np.maximum(np.abs(b), TINY)


def horizon_check(spec: Spec, a: RunKey, b: RunKey, la: np.ndarray, lb: np.ndarray) -> Check:
    rule = spec.checks.loss_curve
    rel = relative_curve_distance(la, lb)
    outside = np.flatnonzero(~(rel <= rule.rtol))
    horizon = int(outside[0]) if outside.size else len(rel)
    need = len(rel) if rule.must_hold_for is None else min(rule.must_hold_for, len(rel))
    what = "the whole run" if rule.must_hold_for is None else f"the first {rule.must_hold_for} steps"
    return Check(
        "loss_curve_horizon",
        a,
        b,
        "pass" if horizon >= need else "fail",
        f"relative loss difference <= {rule.rtol:g} over {what}",
        float(np.abs(la - lb).max(initial=0.0)),
        float(rel.max(initial=0.0)),
        first_failure_step=int(outside[0]) if outside.size else None,
        horizon_steps=horizon,
    )


def calibrate(outcomes: dict[RunKey, Outcome], members: list[Outcome]) -> Calibration | None:
    """The float32-vs-float64 distances of the array-module code on this spec: the plain
    float32 run and the members that sum in other orders, the largest at each step."""
    cal, oracle = outcomes.get(CALIBRATION_KEY), outcomes.get(ORACLE_KEY)
    runs = [cal, *members]
    if not (oracle and oracle.status == "ok" and all(r and r.status == "ok" for r in runs)):
        return None
    distance = np.max([relative_curve_distance(r.losses, oracle.losses) for r in runs], axis=0)
    outputs = max(float(np.abs(r.final_outputs - oracle.final_outputs).max()) for r in runs)
    return Calibration(np.maximum.accumulate(distance), outputs, len(runs))


def envelope_checks(spec: Spec, a: Outcome, b: Outcome, cal: Calibration | None) -> list[Check]:
    rule = spec.checks.long_run
    names = ["loss_curve_envelope", "final_outputs", *(f"final_{m}" for m in sorted(b.metrics))]
    skip_reason = None
    if cal is None:
        skip_reason = "no calibration: needs ok runs of cupy@cpu (float32, and its members) and the oracle"
    elif {a.key, b.key} == {CALIBRATION_KEY, ORACLE_KEY}:
        skip_reason = "this pair is the calibration that defines the envelope"
    if skip_reason:
        return [Check(n, a.key, b.key, "skipped", "envelope rule", reason=skip_reason) for n in names]

    checks = []
    rel = relative_curve_distance(a.losses, b.losses)
    allowed = rule.factor * cal.curve + rule.curve_floor
    outside = np.flatnonzero(~(rel <= allowed))
    checks.append(
        Check(
            "loss_curve_envelope",
            a.key,
            b.key,
            "fail" if outside.size else "pass",
            f"relative loss difference <= {rule.factor:g} * e(t) + {rule.curve_floor:g}, "
            f"e(t) = float32-vs-float64 distance, max of {cal.runs} runs (the plain run and "
            f"{cal.runs - 1} summing in other orders; final e = {cal.curve[-1]:.3g})",
            float(np.abs(a.losses - b.losses).max(initial=0.0)),
            float(rel.max(initial=0.0)),
            first_failure_step=int(outside[0]) if outside.size else None,
        )
    )
    max_abs, max_rel = _errors(a.final_outputs, b.final_outputs)
    allowed = rule.factor * cal.outputs + rule.output_floor
    checks.append(
        Check(
            "final_outputs",
            a.key,
            b.key,
            "pass" if max_abs <= allowed else "fail",
            f"max |a-b| <= {rule.factor:g} * {cal.outputs:.3g} + {rule.output_floor:g} = {allowed:.3g}",
            max_abs,
            max_rel,
        )
    )
    allowed_rel = rule.factor * cal.curve[-1]
    for metric in sorted(b.metrics):
        diff = abs(a.metrics[metric] - b.metrics[metric])
        allowed = allowed_rel * abs(b.metrics[metric]) + rule.metric_floor
        checks.append(
            Check(
                f"final_{metric}",
                a.key,
                b.key,
                "pass" if diff <= allowed else "fail",
                f"|a-b| <= {rule.factor:g} * {cal.curve[-1]:.3g} * |b| + {rule.metric_floor:g} = {allowed:.3g}",
                diff,
                diff / max(abs(b.metrics[metric]), TINY),
            )
        )
    return checks


def pair_checks(spec: Spec, a: Outcome, b: Outcome, cal: Calibration | None) -> list[Check]:
    """Every check of run a against run b (b is the reference where it is the oracle)."""
    c = spec.checks
    k = c.params_after_steps.step
    loss0 = close_check("initial_loss", a.key, b.key, a.losses[:1], b.losses[:1], c.initial_loss)
    return [
        close_check("initial_outputs", a.key, b.key, a.initial_outputs, b.initial_outputs, c.initial_outputs),
        loss0,
        close_check(
            "params_after_step_1",
            a.key,
            b.key,
            _flat(a.snapshots[1]),
            _flat(b.snapshots[1]),
            c.params_after_first_step,
        ),
        close_check(
            f"params_after_step_{k}", a.key, b.key, _flat(a.snapshots[k]), _flat(b.snapshots[k]), c.params_after_steps
        ),
        horizon_check(spec, a.key, b.key, a.losses, b.losses),
        *envelope_checks(spec, a, b, cal),
    ]


def _matches(known: KnownDifference, check: Check) -> bool:
    return check.name == known.check and any(
        k.framework == known.framework and k.device in known.devices and k.mode in known.modes for k in (check.a, check.b)
    )


def apply_known_differences(spec: Spec, checks: list[Check]) -> list[Check]:
    """Mark explained failures 'known'; report a strict entry that no longer fails as a failure."""
    marked = []
    for check in checks:
        known = next((k for k in spec.known_differences if _matches(k, check)), None)
        if known and check.verdict == "fail":
            check = replace(check, verdict="known", reason=f"known difference: {known.reason}")
        marked.append(check)
    for known in spec.known_differences:
        judged = [c for c in checks if _matches(known, c) and c.verdict != "skipped"]
        if known.strict and judged and not any(c.verdict == "fail" for c in judged):
            first = judged[0]
            marked.append(
                Check(
                    "known_difference_absent",
                    first.a,
                    first.b,
                    "fail",
                    f"spec lists {known.framework}/{known.check} as a known difference",
                    reason="the listed difference did not occur: remove it from known_differences",
                )
            )
    return marked


def _judged_pair(a: RunKey, b: RunKey) -> bool:
    """A TF32 run is measured against the oracle only: what TF32 costs in agreement, not a
    cross product of expected failures."""
    return (a.precision == STRICT and b.precision == STRICT) or ORACLE_KEY in (a, b)


def gating(check: Check) -> bool:
    """Whether a failing check fails the run: every check but those of TF32 runs, which
    measure a precision mode the float32 tolerances are not meant for."""
    return check.a.precision == STRICT and check.b.precision == STRICT


def check_all(spec: Spec, outcomes: dict[RunKey, Outcome], members: list[Outcome] = ()) -> list[Check]:
    """Every pair of successful runs: each framework against the oracle and against each other."""
    cal = calibrate(outcomes, list(members))
    ok = [o for o in outcomes.values() if o.status == "ok"]
    # The oracle is always the reference (b) of its pairs.
    ok.sort(key=lambda o: o.key == ORACLE_KEY)
    pairs = [(a, b) for a, b in combinations(ok, 2) if _judged_pair(a.key, b.key)]
    checks = [check for a, b in pairs for check in pair_checks(spec, a, b, cal)]
    return apply_known_differences(spec, checks)
