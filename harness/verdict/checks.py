"""The measures of agreement between runs of one spec: each check with its measured error,
its tolerance (as prose, and as fields: `Bound`), a verdict that can fail, and, when it
fails, a diagnosis (harness/verdict/diagnosis.py). Which checks a matrix takes, over which
runs, is the list of rules in harness/verdict/rules.py.

Every tolerance is calibrated on the spec itself (harness/calibrate/spread.py): factor times
the spread of rounding-only runs, plus a rounding floor of a few units of the dtype's
rounding (a tolerance's floor; the hardware floor of a step is harness/hardware/floor.py).

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

from dataclasses import dataclass

import numpy as np

from harness.calibrate.spread import TINY, Spread, relative_curve_distance, tensors
from harness.core.registry import BF16, CALIBRATION_PAIRS, FLOAT32, FLOAT64, CheckVerdict, RunKey
from harness.run.runner import Outcome
from harness.spec.model import Close, Spec
from harness.verdict.bound import Bound

# The floor of every calibrated check, in units of the compared dtype's rounding (machine
# epsilon) times the size of the reference: no difference below a few roundings of the
# value itself is a failure, even where every member happened to round alike.
ROUNDING_ULPS = 4
# bfloat16's: 8 significant bits (a bf16 envelope's rounding floor)
EPS = {FLOAT32: float(np.finfo(np.float32).eps), FLOAT64: float(np.finfo(np.float64).eps), BF16: 2.0**-7}
MATH = "math_"  # the prefix of the math-parity checks


@dataclass(frozen=True)
class Check:
    name: str
    a: RunKey
    b: RunKey
    verdict: CheckVerdict
    tolerance: str
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    first_failure_step: int | None = None
    horizon_steps: int | None = None
    reason: str | None = None
    ratio: float | None = None  # the error over its tolerance, where it is largest (> 1: fails)
    tensor: str | None = None  # the parameter tensor whose ratio is largest (dense1.weight, ...)
    diagnosis: str | None = None  # why a failing or known check fails (harness/verdict/diagnosis.py)
    bound: Bound | None = None
    # A math-parity check: the first layer whose output on the first batch differs from the
    # oracle's (forward pass, training mode; first_layer_apart), where the twin has them.
    forward_layer: str | None = None
    # A re-anchored math-parity check: the step of the segment where it first fails (or is
    # closest to failing), the twin started there from the oracle's state.
    segment: int | None = None
    # A known check that non-strict library entries alone explain, as far as their members
    # reach (diagnosis.library_known): the rest of the envelope's members are not run for it.
    library_known: bool = False

    def involves(self, key: RunKey) -> bool:
        return key in (self.a, self.b)

    def other(self, key: RunKey) -> RunKey:
        return self.b if key == self.a else self.a


def _errors(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(b), TINY)
    return float(diff.max(initial=0.0)), float(rel.max(initial=0.0))


def _verdict(holds: bool) -> CheckVerdict:
    return CheckVerdict.PASS if holds else CheckVerdict.FAIL


def _ratio(error: float, allowed: float) -> float:
    return error / allowed if allowed > 0 else (0.0 if error == 0 else float("inf"))


def close_check(name: str, a: RunKey, b: RunKey, va: np.ndarray, vb: np.ndarray, tol: Close) -> Check:
    """A hand-set allclose tolerance (a spec's override of a calibrated check)."""
    va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
    rule = f"|a-b| <= {tol.atol:g} + {tol.rtol:g}*|b| (the spec's override)"
    if va.shape != vb.shape:
        return Check(name, a, b, CheckVerdict.FAIL, rule, reason=f"shapes differ: {va.shape} vs {vb.shape}")
    max_abs, max_rel = _errors(va, vb)
    allowed = (tol.atol + tol.rtol * np.abs(vb)).ravel()
    ratios = [_ratio(float(e), float(t)) for e, t in zip(np.abs(va - vb).ravel(), allowed)]
    ratio = max(ratios, default=0.0)
    at = float(allowed[int(np.argmax(ratios))]) if ratios else None
    bound = Bound("", "allclose", allowed=at, floor=tol.atol, rtol=tol.rtol)
    return Check(name, a, b, _verdict(ratio <= 1), rule, max_abs, max_rel, ratio=ratio, bound=bound)


def spread_prose(runs: int, dtype: str, where: str) -> str:
    """What a spread is the distance of, in a tolerance's prose (`where`: from whom, with its
    leading punctuation). On the zeroth look (harness/calibrate/roles.py ZEROTH) no member ran:
    a float32 spread is the plain run's alone, a float64 one is 0 (the tolerance is its floor)."""
    if runs == 0:
        return "0 (no member summing in other orders was needed: the rounding floor alone)"
    if dtype == FLOAT32 and runs == 1:
        return f"the distance of the plain {dtype} run{where} (no member summing in other orders was needed)"
    return f"the largest distance of {runs} {dtype} runs summing in other orders{where}"


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
    at_least_one: bool = False,
) -> Check:
    """Per tensor: ||a - b|| <= factor * s + ROUNDING_ULPS * eps * ||b||, s the members' spread;
    with `at_least_one`, the floor is ROUNDING_ULPS * eps * max(||b||, 1): a float64 loss
    below 1 (loss_floor)."""
    va = [np.asarray(x, np.float64) for x in va]
    vb = [np.asarray(y, np.float64) for y in vb]
    eps = EPS[cal.dtype]
    size = "max(||b||, 1)" if at_least_one else "||b||"
    spread_of = spread_prose(cal.runs, cal.dtype, f" from {cal.around}")
    rule = f"per tensor ||a-b|| <= {factor:g} * s + {ROUNDING_ULPS} * {eps:.3g} * {size}, s = {spread_of}"
    if [x.shape for x in va] != [y.shape for y in vb]:
        return Check(name, a, b, CheckVerdict.FAIL, rule, reason="shapes differ", first_failure_step=step)
    errors = [float(np.linalg.norm(x - y)) for x, y in zip(va, vb)]
    allowed = [factor * s + ROUNDING_ULPS * eps * max(float(np.linalg.norm(y)), 1.0 if at_least_one else 0.0) for s, y in zip(spread, vb)]
    ratios = [_ratio(e, t) for e, t in zip(errors, allowed)]
    worst = int(np.argmax(ratios))
    max_abs, max_rel = _errors(np.concatenate([x.ravel() for x in va]), np.concatenate([y.ravel() for y in vb]))
    failed = not ratios[worst] <= 1  # a non-finite error fails: NaN compares false
    where = names[worst] if names else None
    detail = f"; worst {where}: {errors[worst]:.3g} of {allowed[worst]:.3g}" if where else f"; {errors[worst]:.3g} of {allowed[worst]:.3g}"
    return Check(
        name,
        a,
        b,
        _verdict(not failed),
        rule + detail,
        max_abs,
        max_rel,
        first_failure_step=step if failed else None,
        ratio=ratios[worst],
        tensor=where,
        bound=Bound(
            "",
            "tensor_l2",
            allowed=allowed[worst],
            factor=factor,
            spread=float(spread[worst]),
            floor=allowed[worst] - factor * spread[worst],
            members=cal.runs,
            dtype=cal.dtype,
        ),
    )


def parted_at(rel: np.ndarray, rtol) -> int:
    """The first step whose relative loss distance `rel` exceeds `rtol` (a number, or one
    per step; a non-finite distance does), len(rel) where none does: where two loss curves
    part."""
    outside = np.flatnonzero(~(rel <= rtol))
    return int(outside[0]) if outside.size else len(rel)


def horizon_check(spec: Spec, a: RunKey, b: RunKey, la: np.ndarray, lb: np.ndarray) -> Check:
    rule = spec.checks.loss_curve
    rel = relative_curve_distance(la, lb)
    horizon = parted_at(rel, rule.rtol)
    need = len(rel) if rule.must_hold_for is None else min(rule.must_hold_for, len(rel))
    what = "the whole run" if rule.must_hold_for is None else f"the first {rule.must_hold_for} steps"
    return Check(
        "loss_curve_horizon",
        a,
        b,
        _verdict(horizon >= need),
        f"relative loss difference <= {rule.rtol:g} over {what} (the spec's rule)",
        float(np.abs(la - lb).max(initial=0.0)),
        float(rel.max(initial=0.0)),
        first_failure_step=horizon if horizon < len(rel) else None,
        horizon_steps=horizon,
        ratio=float(rel[:need].max(initial=0.0)) / rule.rtol,
        bound=Bound("", "relative_curve", allowed=rule.rtol, rtol=rule.rtol),
    )


def loss_floor(losses: np.ndarray) -> np.ndarray:
    """A float64 loss's own rounding, relative, per step: 4 ulps of the loss, or of 1 where
    the loss is smaller. A cross-entropy near 0 is -log(p) of a probability p rounded next
    to 1, so every honest library's value sits on a grid of eps in absolute terms; where the
    calibration members happen to land on the same grid point, their spread says 0 there."""
    return ROUNDING_ULPS * EPS[FLOAT64] * np.maximum(1.0, 1.0 / np.maximum(np.abs(losses), TINY))


def curve_check(name: str, a: RunKey, b: RunKey, la, lb, factor: float, spread: Spread, floor, rule: str) -> Check:
    """The relative loss distance against the per-step allowance factor * e(t) + floor, e(t)
    the members' spread of the curve (floor: a number, or one per step). Where a member
    diverged, the steps before the first divergence (those the spread bounds)."""
    if spread.diverged:
        finite = len(spread.curve)
        la, lb = la[:finite], lb[:finite]
        floor = floor if np.ndim(floor) == 0 else np.asarray(floor)[:finite]
        rule += f"; judged over steps 0-{finite - 1}: {spread.unbounded}"
    allowed = factor * spread.curve + floor
    rel = relative_curve_distance(la, lb)
    horizon = parted_at(rel, allowed)
    ratios = [_ratio(float(r), float(t)) for r, t in zip(rel, allowed)]
    ratio = max(ratios, default=0.0)
    worst = int(np.argmax(ratios)) if ratios else len(allowed) - 1
    bound = Bound(
        "",
        "relative_curve",
        allowed=float(allowed[worst]),
        factor=factor,
        spread=float(spread.curve[worst]),
        floor=float(np.broadcast_to(floor, allowed.shape)[worst]),
        members=spread.runs,
        dtype=spread.dtype,
    )
    return Check(
        name,
        a,
        b,
        _verdict(horizon == len(rel)),
        rule,
        float(np.abs(la - lb).max(initial=0.0)),
        float(rel.max(initial=0.0)),
        first_failure_step=horizon if horizon < len(rel) else None,
        horizon_steps=horizon,
        ratio=ratio,
        bound=bound,
    )


def skipped(names: list[str], a: RunKey, b: RunKey, rule: str, reason: str) -> list[Check]:
    return [Check(n, a, b, CheckVerdict.SKIPPED, rule, reason=reason) for n in names]


NO_CALIBRATION = "no calibration: needs ok runs of numpy@cpu (float32, and its members) and the oracle"


def envelope(spec: Spec, cal: Spread) -> np.ndarray:
    """The relative loss tolerance per step between any two float32 runs: factor * e(t) + floor."""
    rule = spec.checks.long_run
    return rule.factor * cal.curve + rule.curve_floor


def envelope_checks(spec: Spec, a: Outcome, b: Outcome, cal: Spread | None) -> list[Check]:
    rule = spec.checks.long_run
    names = ["loss_curve_envelope", "final_outputs", *(f"final_{m}" for m in sorted(b.metrics))]
    if cal is None:
        return skipped(names, a.key, b.key, "envelope rule", NO_CALIBRATION)
    if {a.key, b.key} in CALIBRATION_PAIRS:
        return skipped(names, a.key, b.key, "envelope rule", "this pair is the calibration that defines the envelope")
    checks = [
        curve_check(
            "loss_curve_envelope",
            a.key,
            b.key,
            a.losses,
            b.losses,
            rule.factor,
            cal,
            rule.curve_floor,
            f"relative loss difference <= {rule.factor:g} * e(t) + {rule.curve_floor:g}, "
            f"e(t) = {cal.dtype}-vs-float64 distance, max of {cal.runs} runs (the plain run and "
            f"{cal.runs - 1} summing in other orders; final e = {cal.curve[-1]:.3g})",
        )
    ]
    if cal.diverged:  # the curve's steps before the first divergence are judged; the rest is unbounded
        return [*checks, *skipped(names[1:], a.key, b.key, "envelope rule", cal.unbounded)]
    max_abs, max_rel = _errors(a.final_outputs, b.final_outputs)
    allowed = rule.factor * cal.final_outputs_max + rule.output_floor
    checks.append(
        Check(
            "final_outputs",
            a.key,
            b.key,
            _verdict(max_abs <= allowed),
            f"max |a-b| <= {rule.factor:g} * {cal.final_outputs_max:.3g} + {rule.output_floor:g} = {allowed:.3g}",
            max_abs,
            max_rel,
            ratio=_ratio(max_abs, allowed),
            bound=Bound("", "max_abs", allowed, rule.factor, cal.final_outputs_max, rule.output_floor, members=cal.runs, dtype=cal.dtype),
        )
    )
    for metric in sorted(b.metrics):
        diff = abs(a.metrics[metric] - b.metrics[metric])
        # the spread in the metric's own units: e(T) * |b|, or the members' own distance in
        # that metric where it is larger
        own = cal.metrics.get(metric, 0.0)
        spread = max(float(cal.curve[-1]) * abs(b.metrics[metric]), own)
        allowed = rule.factor * spread + rule.metric_floor
        checks.append(
            Check(
                f"final_{metric}",
                a.key,
                b.key,
                _verdict(diff <= allowed),
                f"|a-b| <= {rule.factor:g} * max({cal.curve[-1]:.3g} * |b|, {own:.3g}) + {rule.metric_floor:g} = {allowed:.3g} "
                f"(e(T) * |b|, or the members' own largest distance in it)",
                diff,
                diff / max(abs(b.metrics[metric]), TINY),
                ratio=_ratio(diff, allowed),
                bound=Bound("", "relative", allowed, rule.factor, spread, rule.metric_floor, members=cal.runs, dtype=cal.dtype),
            )
        )
    return checks


def short_horizon_checks(spec: Spec, a: Outcome, b: Outcome, cal: Spread | None, prefix: str = "") -> list[Check]:
    """Outputs and loss at step 0, parameters after step 1 and after step k (those the
    reference has): calibrated on `cal`, or the spec's override (float32 pairs only)."""
    c = spec.checks
    factor = c.long_run.factor
    names = list(next(iter(b.snapshots.values()), None) or b.final_params or {})
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
            reason = cal.unbounded if cal is not None and cal.diverged else NO_CALIBRATION  # a snapshot after the first divergence
            checks.append(Check(prefix + name, a.key, b.key, CheckVerdict.SKIPPED, "calibrated", reason=reason))
        else:
            labels = names if name.startswith("params") else None
            # math parity's step-0 loss takes the loss curve's floor (loss_floor): 4 ulps of the
            # loss, or of 1 where the loss is smaller, the step-0 point of the same curve
            loss = bool(prefix) and name == "initial_loss"
            checks.append(tensor_check(prefix + name, a.key, b.key, va, vb, spread_of(cal), factor, cal, labels, step, at_least_one=loss))
    return checks
