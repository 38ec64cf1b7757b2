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

import dataclasses
from dataclasses import dataclass

import numpy as np

from harness.calibrate.spread import TINY, Calibration, Segments, Spread, relative_curve_distance, tensors
from harness.core.registry import CALIBRATION_KEY, FLOAT32, FLOAT64, ORACLE_KEY, RunKey, Verdict
from harness.run.runner import Outcome
from harness.spec.model import Close, Spec
from harness.verdict.bound import Bound

# The floor of every calibrated check, in units of the compared dtype's rounding (machine
# epsilon) times the size of the reference: no difference below a few roundings of the
# value itself is a failure, even where every member happened to round alike.
ROUNDING_ULPS = 4
EPS = {FLOAT32: float(np.finfo(np.float32).eps), FLOAT64: float(np.finfo(np.float64).eps)}
MATH = "math_"  # the prefix of the math-parity checks


@dataclass(frozen=True)
class Check:
    name: str
    a: RunKey
    b: RunKey
    verdict: Verdict
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

    def involves(self, key: RunKey) -> bool:
        return key in (self.a, self.b)

    def other(self, key: RunKey) -> RunKey:
        return self.b if key == self.a else self.a


def _errors(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(b), TINY)
    return float(diff.max(initial=0.0)), float(rel.max(initial=0.0))


def _verdict(holds: bool) -> Verdict:
    return Verdict.PASS if holds else Verdict.FAIL


def _ratio(error: float, allowed: float) -> float:
    return error / allowed if allowed > 0 else (0.0 if error == 0 else float("inf"))


def close_check(name: str, a: RunKey, b: RunKey, va: np.ndarray, vb: np.ndarray, tol: Close) -> Check:
    """A hand-set allclose tolerance (a spec's override of a calibrated check)."""
    va, vb = np.asarray(va, np.float64), np.asarray(vb, np.float64)
    rule = f"|a-b| <= {tol.atol:g} + {tol.rtol:g}*|b| (the spec's override)"
    if va.shape != vb.shape:
        return Check(name, a, b, Verdict.FAIL, rule, reason=f"shapes differ: {va.shape} vs {vb.shape}")
    max_abs, max_rel = _errors(va, vb)
    allowed = (tol.atol + tol.rtol * np.abs(vb)).ravel()
    ratios = [_ratio(float(e), float(t)) for e, t in zip(np.abs(va - vb).ravel(), allowed)]
    ratio = max(ratios, default=0.0)
    at = float(allowed[int(np.argmax(ratios))]) if ratios else None
    bound = Bound("", "allclose", allowed=at, floor=tol.atol, rtol=tol.rtol)
    return Check(name, a, b, _verdict(ratio <= 1), rule, max_abs, max_rel, ratio=ratio, bound=bound)


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
    rule = (
        f"per tensor ||a-b|| <= {factor:g} * s + {ROUNDING_ULPS} * {eps:.3g} * {size}, s = the largest distance "
        f"of {cal.runs} {cal.dtype} runs summing in other orders from the oracle"
    )
    if [x.shape for x in va] != [y.shape for y in vb]:
        return Check(name, a, b, Verdict.FAIL, rule, reason="shapes differ", first_failure_step=step)
    errors = [float(np.linalg.norm(x - y)) for x, y in zip(va, vb)]
    allowed = [factor * s + ROUNDING_ULPS * eps * max(float(np.linalg.norm(y)), 1.0 if at_least_one else 0.0) for s, y in zip(spread, vb)]
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
        _verdict(horizon >= need),
        f"relative loss difference <= {rule.rtol:g} over {what} (the spec's rule)",
        float(np.abs(la - lb).max(initial=0.0)),
        float(rel.max(initial=0.0)),
        first_failure_step=int(outside[0]) if outside.size else None,
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
    the members' spread of the curve (floor: a number, or one per step)."""
    allowed = factor * spread.curve + floor
    rel = relative_curve_distance(la, lb)
    outside = np.flatnonzero(~(rel <= allowed))
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
        _verdict(not outside.size),
        rule,
        float(np.abs(la - lb).max(initial=0.0)),
        float(rel.max(initial=0.0)),
        first_failure_step=int(outside[0]) if outside.size else None,
        horizon_steps=int(outside[0]) if outside.size else len(rel),
        ratio=ratio,
        bound=bound,
    )


def _skipped(names: list[str], a: RunKey, b: RunKey, rule: str, reason: str) -> list[Check]:
    return [Check(n, a, b, Verdict.SKIPPED, rule, reason=reason) for n in names]


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
            rule.factor,
            cal,
            rule.curve_floor,
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
            checks.append(Check(prefix + name, a.key, b.key, Verdict.SKIPPED, "calibrated", reason=NO_CALIBRATION))
        else:
            labels = names if name.startswith("params") else None
            # math parity's step-0 loss takes the loss curve's floor (loss_floor): 4 ulps of the
            # loss, or of 1 where the loss is smaller, the step-0 point of the same curve
            loss = bool(prefix) and name == "initial_loss"
            checks.append(tensor_check(prefix + name, a.key, b.key, va, vb, spread_of(cal), factor, cal, labels, step, at_least_one=loss))
    return checks


# How far apart two float64 layer outputs may be, relative to the oracle's largest value,
# and still count as the same math where the diagnosis looks for the first layer to differ:
# 1e-10 is about 5e5 float64 ulps, far above the twins' rounding (1e-16 to 1e-14 measured on
# every layer kind, tests/test_layers_frameworks.py) and far below the smallest porting bug
# (an eps moved from 1e-5 to 1e-4: about 1e-6). It names a layer; it judges nothing.
LAYERS_APART = 1e-10


def first_layer_apart(twin: dict[str, np.ndarray], oracle: dict[str, np.ndarray]) -> str | None:
    """The first layer, in the network's order, whose output differs from the oracle's."""
    for name, want in oracle.items():
        got = twin.get(name)
        if got is None or got.shape != want.shape:
            return name
        if np.abs(got - want).max(initial=0) > LAYERS_APART * max(np.abs(want).max(initial=0), np.finfo(np.float64).tiny):
            return name
    return None


def math_parity_checks(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """A float64 twin against the oracle over the twins' first steps, calibrated on the
    oracle's own reordered members: a failure here is different math."""
    reference, spread = cal.reference_of(twin.key), cal.spread_of(twin.key)
    names = [f"{MATH}{n}" for n in ("initial_outputs", "initial_loss", "loss_curve", "final_outputs")]
    if reference is None or reference.status != "ok" or spread is None:
        reason = "no float64 calibration: needs ok runs of the oracle's first steps and its reordered members"
        return _skipped(names, twin.key, ORACLE_KEY, "math parity", reason)
    factor = spec.checks.long_run.factor
    eps = EPS[FLOAT64]
    checks = [dataclasses.replace(check, b=ORACLE_KEY) for check in short_horizon_checks(spec, twin, reference, spread, prefix=MATH)]
    checks.append(
        curve_check(
            f"{MATH}loss_curve",
            twin.key,
            ORACLE_KEY,
            twin.losses,
            reference.losses,
            factor,
            spread,
            loss_floor(reference.losses),
            f"relative loss difference <= {factor:g} * e64(t) + {ROUNDING_ULPS} * {eps:.3g} * max(1, 1/|loss|), e64(t) = the largest "
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
    layer = first_layer_apart(twin.layer_outputs, reference.layer_outputs) if reference.layer_outputs else None
    return [dataclasses.replace(c, forward_layer=layer) for c in checks] if layer else checks


def anchored_parity_check(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """The twin re-anchored along the run (harness/run/anchored.py): over each segment,
    started from the oracle's state, against the oracle's own steps from it, calibrated on
    the float64 members started from the same state. The first segment to fail is where
    the difference starts."""
    name = f"{MATH}anchored_loss_curve"
    run, segments = cal.anchored.get((twin.key.framework, twin.key.device)), cal.segments_of(twin.key)
    if run is None and segments is None:
        return []  # a run too short for a segment after the first steps
    rule = "math parity re-anchored at the oracle's state"
    if run is not None and run.status != "ok":
        return [Check(name, twin.key, ORACLE_KEY, Verdict.FAIL, rule, reason=run.reason, first_failure_step=run.failed_at_step)]
    if run is None or segments is None or cal.float64 is None or sorted(run.segments) != sorted(segments.reference):
        return _skipped([name], twin.key, ORACLE_KEY, rule, "no calibrated segments: needs the oracle's states and its members' re-anchored runs")
    factor = spec.checks.long_run.factor
    references = segments.reference
    library = cal.library.get((twin.key.framework, twin.key.device))
    if library is not None:  # the oracle computing the library's formula, from the same states
        if library[1] is None or library[1].status != "ok" or sorted(library[1].segments) != sorted(references):
            return _skipped([name], twin.key, ORACLE_KEY, rule, "the oracle computing the library's formula did not run every segment")
        references = library[1].segments
    found = []
    for start, reference in sorted(references.items()):
        spread = dataclasses.replace(cal.float64, curve=segments.curve[start], runs=segments.runs)  # the segment's own spread
        check = curve_check(name, twin.key, ORACLE_KEY, run.segments[start], reference, factor, spread, loss_floor(reference), rule)
        step = None if check.first_failure_step is None else start + check.first_failure_step
        found.append(dataclasses.replace(check, first_failure_step=step, horizon_steps=None, segment=start))
    chosen = _first_failing_or_worst(found)
    starts = ", ".join(str(a) for a in sorted(segments.reference))
    tolerance = (
        f"over each segment of {spec.checks.math_parity.steps} steps from the oracle's state at steps {starts}: relative loss "
        f"difference <= {factor:g} * e64(t) + {ROUNDING_ULPS} * {EPS[FLOAT64]:.3g} * max(1, 1/|loss|), e64(t) = the largest distance of "
        f"{segments.runs} float64 runs summing in other orders, started from the same state"
    )
    curve = dataclasses.replace(
        chosen,
        tolerance=tolerance,
        ratio=max(c.ratio or 0.0 for c in found),
        max_abs_error=max(c.max_abs_error for c in found),
        max_rel_error=max(c.max_rel_error for c in found),
    )
    return [curve, *segment_end_checks(spec, twin, run, segments, cal)]


def _first_failing_or_worst(found: list[Check]) -> Check:
    """Of one check over several segments: the first that fails (where the difference
    starts), or the one closest to failing."""
    failing = [c for c in found if c.verdict == Verdict.FAIL]
    return failing[0] if failing else max(found, key=lambda c: c.ratio or 0.0)


def segment_end_checks(spec: Spec, twin: Outcome, run: Outcome, segments: Segments, cal: Calibration) -> list[Check]:
    """At each re-anchored segment's end: every tensor the run carries (parameters,
    batch-norm statistics, the optimizer's moments), and the probe's outputs in evaluation mode (through those
    statistics), against the reference's own at that step (the oracle's, or the oracle
    computing the library's formula), calibrated per tensor on the members started from the
    same state. A difference that changes no training loss (a running variance stored
    otherwise, a momentum slip in a buffer) shows here. The first segment to fail is where
    it starts; none where the reference kept no segment ends."""
    starts = [a for a in sorted(segments.end_reference) if a in run.segment_ends and a in run.segment_outputs]
    if not starts or cal.float64 is None:
        return []
    factor, steps = spec.checks.long_run.factor, spec.checks.math_parity.steps
    spread = dataclasses.replace(cal.float64, runs=segments.runs)
    states, outputs = [], []
    for a in starts:
        reference, mine = segments.end_reference[a], run.segment_ends[a]
        missing = [n for n in reference if "/" not in n and n not in mine]
        if missing:
            reason = f"it carries no {', '.join(missing)}"
            states.append(Check(f"{MATH}anchored_state", twin.key, ORACLE_KEY, Verdict.FAIL, "every tensor", reason=reason, segment=a))
        else:
            # every tensor the reference and its members kept, and the optimizer moments the
            # run carries too (an adapter without training_state carries none)
            names = [n for n in reference if n in segments.end_params[a] and n in mine]
            check = tensor_check(
                f"{MATH}anchored_state",
                twin.key,
                ORACLE_KEY,
                [mine[n] for n in names],
                [reference[n] for n in names],
                [segments.end_params[a][n] for n in names],
                factor,
                spread,
                names,
                a + steps,
            )
            states.append(dataclasses.replace(check, segment=a))
        check = tensor_check(
            f"{MATH}anchored_outputs",
            twin.key,
            ORACLE_KEY,
            [run.segment_outputs[a]],
            [segments.output_reference[a]],
            [segments.end_outputs[a]],
            factor,
            spread,
            None,
            a + steps,
        )
        outputs.append(dataclasses.replace(check, segment=a))
    where = ", ".join(str(a + steps) for a in starts)
    found = []
    for group, what in (
        (states, "every tensor (batch-norm statistics and optimizer moments too)"),
        (outputs, "the probe's outputs in evaluation mode"),
    ):
        chosen = _first_failing_or_worst(group)
        found.append(
            dataclasses.replace(
                chosen,
                tolerance=f"{what} at the end of each re-anchored segment (steps {where}): {chosen.tolerance}",
                ratio=max(c.ratio or 0.0 for c in group),
            )
        )
    return found
