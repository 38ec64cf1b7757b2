"""Agreement checks between runs of one spec, each with its measured error, its tolerance,
a verdict that can fail, and, when it fails, a diagnosis (harness/verdict/diagnosis.py).

Every tolerance is calibrated on the spec itself (harness/verdict/calibration.py): factor times
the spread of rounding-only runs, plus a floor of a few units of the dtype's rounding.

- Short horizon (float32 pairs): the probe outputs and the loss at step 0, the parameters
  after the first step and after step k, per tensor, against the float32 members' spread
  from the oracle. A spec may override any of them with a hand-set allclose tolerance.
- Long run, the envelope rule: the loss at step t relatively by factor * e(t) + floor, each
  final metric relatively by factor * e(T), the final outputs absolutely by factor * e_out.
  The calibration pair itself cannot be judged by the rule it defines: its envelope
  checks are skipped, with that reason.
- Math parity (each float64 twin against the oracle, over the twins' first steps): the
  same quantities against the float64 members' spread. A failure there is different math.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from harness.core.registry import CALIBRATION_KEY, FLOAT64, ORACLE_KEY, STRICT, RunKey
from harness.run.runner import Outcome
from harness.spec.model import Close, Spec
from harness.verdict.calibration import TINY, Spread, relative_curve_distance, tensor_names, tensors

# The floor of every calibrated check, in units of the compared dtype's rounding (machine
# epsilon) times the size of the reference: no difference below a few roundings of the
# value itself is a failure, even where every member happened to round alike.
ROUNDING_ULPS = 4
EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}
MATH = "math_"  # the prefix of the math-parity checks


@dataclass(frozen=True)
class Check:
    name: str
    a: RunKey
    b: RunKey
    verdict: str  # pass, fail, known (an explained failure), skipped
    tolerance: str
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    first_failure_step: int | None = None
    horizon_steps: int | None = None
    reason: str | None = None
    ratio: float | None = None  # the error over its tolerance, where it is largest (> 1: fails)
    tensor: str | None = None  # the parameter tensor whose ratio is largest (W1, b1, ...)
    diagnosis: str | None = None  # why a failing or known check fails (harness/verdict/diagnosis.py)

    def involves(self, key: RunKey) -> bool:
        return key in (self.a, self.b)

    def other(self, key: RunKey) -> RunKey:
        return self.b if key == self.a else self.a


@dataclass(frozen=True)
class Calibration:
    """The spreads that set every tolerance of a spec's matrix."""

    float32: Spread | None  # the array-module float32 run and members against the oracle
    float64: Spread | None  # the oracle's reordered members against the oracle, first steps
    twin_reference: Outcome | None = None  # the oracle over the twins' steps


def _errors(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(b), TINY)
    return float(diff.max(initial=0.0)), float(rel.max(initial=0.0))


def _ratio(error: float, allowed: float) -> float:
    return error / allowed if allowed > 0 else (0.0 if error == 0 else float("inf"))


def close_check(name: str, a: RunKey, b: RunKey, va: np.ndarray, vb: np.ndarray, tol: Close) -> Check:
    """A hand-set allclose tolerance (a spec's override of a calibrated check)."""
    va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
    rule = f"|a-b| <= {tol.atol:g} + {tol.rtol:g}*|b| (the spec's override)"
    if va.shape != vb.shape:
        return Check(name, a, b, "fail", rule, reason=f"shapes differ: {va.shape} vs {vb.shape}")
    max_abs, max_rel = _errors(va, vb)
    allowed = tol.atol + tol.rtol * np.abs(vb)
    ratio = max((_ratio(float(e), float(t)) for e, t in zip(np.abs(va - vb).ravel(), allowed.ravel())), default=0.0)
    return Check(name, a, b, "pass" if ratio <= 1 else "fail", rule, max_abs, max_rel, ratio=ratio)


def tensor_check(
    name: str,
    a: RunKey,
    b: RunKey,
    va: list[np.ndarray],
    vb: list[np.ndarray],
    spread: list[float],
    factor: float,
    cal: Spread,
    names: list[str] | None = None,
    step: int | None = None,
) -> Check:
    """Per tensor: ||a - b|| <= factor * s + ROUNDING_ULPS * eps * ||b||, s the members' spread."""
    va = [np.asarray(x, np.float64) for x in va]
    vb = [np.asarray(y, np.float64) for y in vb]
    eps = EPS[cal.dtype]
    rule = (
        f"per tensor ||a-b|| <= {factor:g} * s + {ROUNDING_ULPS} * {eps:.3g} * ||b||, s = the largest distance "
        f"of {cal.runs} {cal.dtype} runs summing in other orders from the oracle"
    )
    if [x.shape for x in va] != [y.shape for y in vb]:
        return Check(name, a, b, "fail", rule, reason="shapes differ", first_failure_step=step)
    errors = [float(np.linalg.norm(x - y)) for x, y in zip(va, vb)]
    allowed = [factor * s + ROUNDING_ULPS * eps * float(np.linalg.norm(y)) for s, y in zip(spread, vb)]
    ratios = [_ratio(e, t) for e, t in zip(errors, allowed)]
    worst = int(np.argmax(ratios))
    max_abs, max_rel = _errors(np.concatenate([x.ravel() for x in va]), np.concatenate([y.ravel() for y in vb]))
    failed = ratios[worst] > 1
    where = names[worst] if names else None
    detail = f"; worst {where}: {errors[worst]:.3g} of {allowed[worst]:.3g}" if where else f"; {errors[worst]:.3g} of {allowed[worst]:.3g}"
    return Check(
        name,
        a,
        b,
        "fail" if failed else "pass",
        rule + detail,
        max_abs,
        max_rel,
        first_failure_step=step if failed else None,
        ratio=ratios[worst],
        tensor=where,
    )


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
        f"relative loss difference <= {rule.rtol:g} over {what} (the spec's rule)",
        float(np.abs(la - lb).max(initial=0.0)),
        float(rel.max(initial=0.0)),
        first_failure_step=int(outside[0]) if outside.size else None,
        horizon_steps=horizon,
        ratio=float(rel[:need].max(initial=0.0)) / rule.rtol,
    )


def curve_check(name: str, a: RunKey, b: RunKey, la, lb, allowed: np.ndarray, rule: str) -> Check:
    """The relative loss distance against a per-step allowance."""
    rel = relative_curve_distance(la, lb)
    outside = np.flatnonzero(~(rel <= allowed))
    ratio = max((_ratio(float(r), float(t)) for r, t in zip(rel, allowed)), default=0.0)
    return Check(
        name,
        a,
        b,
        "fail" if outside.size else "pass",
        rule,
        float(np.abs(la - lb).max(initial=0.0)),
        float(rel.max(initial=0.0)),
        first_failure_step=int(outside[0]) if outside.size else None,
        horizon_steps=int(outside[0]) if outside.size else len(rel),
        ratio=ratio,
    )


def _skipped(names: list[str], a: RunKey, b: RunKey, rule: str, reason: str) -> list[Check]:
    return [Check(n, a, b, "skipped", rule, reason=reason) for n in names]


NO_CALIBRATION = "no calibration: needs ok runs of numpy@cpu (float32, and its members) and the oracle"


def envelope(spec: Spec, cal: Spread) -> np.ndarray:
    """The relative loss tolerance per step between any two float32 runs: factor * e(t) + floor."""
    rule = spec.checks.long_run
    return rule.factor * cal.curve + rule.curve_floor


def envelope_checks(spec: Spec, a: Outcome, b: Outcome, cal: Spread | None) -> list[Check]:
    rule = spec.checks.long_run
    names = ["loss_curve_envelope", "final_outputs", *(f"final_{m}" for m in sorted(b.metrics))]
    if cal is None:
        return _skipped(names, a.key, b.key, "envelope rule", NO_CALIBRATION)
    if {a.key, b.key} == {CALIBRATION_KEY, ORACLE_KEY}:
        return _skipped(names, a.key, b.key, "envelope rule", "this pair is the calibration that defines the envelope")
    checks = [
        curve_check(
            "loss_curve_envelope",
            a.key,
            b.key,
            a.losses,
            b.losses,
            envelope(spec, cal),
            f"relative loss difference <= {rule.factor:g} * e(t) + {rule.curve_floor:g}, "
            f"e(t) = float32-vs-float64 distance, max of {cal.runs} runs (the plain run and "
            f"{cal.runs - 1} summing in other orders; final e = {cal.curve[-1]:.3g})",
        )
    ]
    max_abs, max_rel = _errors(a.final_outputs, b.final_outputs)
    allowed = rule.factor * cal.final_outputs_max + rule.output_floor
    checks.append(
        Check(
            "final_outputs",
            a.key,
            b.key,
            "pass" if max_abs <= allowed else "fail",
            f"max |a-b| <= {rule.factor:g} * {cal.final_outputs_max:.3g} + {rule.output_floor:g} = {allowed:.3g}",
            max_abs,
            max_rel,
            ratio=_ratio(max_abs, allowed),
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
                ratio=_ratio(diff, allowed),
            )
        )
    return checks


def short_horizon_checks(spec: Spec, a: Outcome, b: Outcome, cal: Spread | None, prefix: str = "") -> list[Check]:
    """Outputs and loss at step 0, parameters after step 1 and after step k (those the
    reference has): calibrated on `cal`, or the spec's override (float32 pairs only)."""
    c = spec.checks
    factor = c.long_run.factor
    names = tensor_names(next(iter(b.snapshots.values()), None) or b.final_params or [])
    overrides = (
        {}
        if prefix
        else {
            "initial_outputs": c.initial_outputs,
            "initial_loss": c.initial_loss,
            "params_after_step_1": c.params_after_first_step,
            f"params_after_step_{c.params_after_steps.step}": c.params_after_steps.override,
        }
    )
    quantities = [
        ("initial_outputs", [a.initial_outputs], [b.initial_outputs], lambda s: [s.initial_outputs], 0),
        ("initial_loss", [a.losses[:1]], [b.losses[:1]], lambda s: [s.initial_loss], 0),
    ]
    for step in sorted({1, c.params_after_steps.step}):
        if step in b.snapshots and step in a.snapshots:
            quantities.append(
                (
                    f"params_after_step_{step}",
                    tensors(a.snapshots[step]),
                    tensors(b.snapshots[step]),
                    lambda s, step=step: s.params.get(step),
                    step,
                )
            )
    checks = []
    for name, va, vb, spread_of, step in quantities:
        override = overrides.get(name)
        if override is not None:
            flat_a, flat_b = np.concatenate([x.ravel() for x in va]), np.concatenate([y.ravel() for y in vb])
            checks.append(close_check(prefix + name, a.key, b.key, flat_a, flat_b, override))
        elif cal is None or spread_of(cal) is None:
            checks.append(Check(prefix + name, a.key, b.key, "skipped", "calibrated", reason=NO_CALIBRATION))
        else:
            labels = names if name.startswith("params") else None
            checks.append(tensor_check(prefix + name, a.key, b.key, va, vb, spread_of(cal), factor, cal, labels, step))
    return checks


def pair_checks(spec: Spec, a: Outcome, b: Outcome, cal: Spread | None) -> list[Check]:
    """Every check of float32 run a against run b (b is the reference where it is the oracle)."""
    checks = short_horizon_checks(spec, a, b, cal)
    if spec.checks.loss_curve is not None:
        checks.append(horizon_check(spec, a.key, b.key, a.losses, b.losses))
    return [*checks, *envelope_checks(spec, a, b, cal)]


def math_parity_checks(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """A float64 twin against the oracle over the twins' first steps, calibrated on the
    oracle's own reordered members: a failure here is different math."""
    reference, spread = cal.twin_reference, cal.float64
    names = [f"{MATH}{n}" for n in ("initial_outputs", "initial_loss", "loss_curve", "final_outputs")]
    if reference is None or reference.status != "ok" or spread is None:
        reason = "no float64 calibration: needs ok runs of the oracle's first steps and its reordered members"
        return _skipped(names, twin.key, ORACLE_KEY, "math parity", reason)
    factor = spec.checks.long_run.factor
    eps = EPS["float64"]
    checks = [dataclasses.replace(check, b=ORACLE_KEY) for check in short_horizon_checks(spec, twin, reference, spread, prefix=MATH)]
    checks.append(
        curve_check(
            f"{MATH}loss_curve",
            twin.key,
            ORACLE_KEY,
            twin.losses,
            reference.losses,
            factor * spread.curve + ROUNDING_ULPS * eps,
            f"relative loss difference <= {factor:g} * e64(t) + {ROUNDING_ULPS} * {eps:.3g}, e64(t) = the largest "
            f"distance of {spread.runs} float64 runs summing in other orders from the oracle "
            f"(over the first {len(reference.losses)} steps; final e64 = {spread.curve[-1]:.3g})",
        )
    )
    checks.append(
        tensor_check(
            f"{MATH}final_outputs",
            twin.key,
            ORACLE_KEY,
            [twin.final_outputs],
            [reference.final_outputs],
            [spread.final_outputs],
            factor,
            spread,
        )
    )
    return checks


def _judged_pair(a: RunKey, b: RunKey) -> bool:
    """A TF32 run is measured against the oracle only: what TF32 costs in agreement, not a
    cross product of expected failures. A float64 twin is judged by math parity alone."""
    if FLOAT64 in (a.precision, b.precision):
        return False
    return (a.precision == STRICT and b.precision == STRICT) or ORACLE_KEY in (a, b)


def gating(check: Check) -> bool:
    """Whether a failing check fails the run: every check but those of TF32 runs, which
    measure a precision mode the float32 tolerances are not meant for."""
    return check.a.precision != "tf32" and check.b.precision != "tf32"


def check_all(spec: Spec, outcomes: dict[RunKey, Outcome], cal: Calibration) -> list[Check]:
    """Every pair of successful float32 runs (each framework against the oracle and against
    each other) and every float64 twin against the oracle, as measured: known differences
    and diagnoses are applied by harness.verdict.diagnosis.verdicts."""
    ok = [o for o in outcomes.values() if o.status == "ok"]
    # The oracle is always the reference (b) of its pairs.
    ok.sort(key=lambda o: o.key == ORACLE_KEY)
    pairs = [(a, b) for a, b in combinations(ok, 2) if _judged_pair(a.key, b.key)]
    checks = [check for a, b in pairs for check in pair_checks(spec, a, b, cal.float32)]
    for twin in ok:
        if twin.key.precision == FLOAT64:
            checks.extend(math_parity_checks(spec, twin, cal))
    reference_ok = cal.twin_reference is not None and cal.twin_reference.status == "ok"
    for twin in outcomes.values():
        if twin.key.precision == FLOAT64 and twin.failed_at_step is not None and reference_ok:
            checks.append(
                Check(
                    f"{MATH}divergence",
                    twin.key,
                    ORACLE_KEY,
                    "fail",
                    "a float64 twin trains wherever the oracle does",
                    first_failure_step=twin.failed_at_step,
                    reason=twin.reason,
                )
            )
    return checks
