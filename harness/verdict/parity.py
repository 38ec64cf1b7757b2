"""Math parity's checks (each float64 twin against the oracle, over the twins' first steps,
and re-anchored along the run from the oracle's states): the same quantities as the float32
checks (harness/verdict/checks.py), against the float64 members' spread. A failure there is
different math; where it fails, the first layer whose float64 output differs is named."""

from __future__ import annotations

import dataclasses

import numpy as np

from harness.calibrate.spread import Calibration, Segments, Spread
from harness.core.registry import ANCHORED_CHECKS, FLOAT64, ORACLE, CheckVerdict, RunKey
from harness.inputs import port
from harness.run.runner import Outcome
from harness.spec.model import Spec
from harness.verdict.checks import EPS, MATH, ROUNDING_ULPS, Check, curve_check, loss_floor, short_horizon_checks, skipped, spread_prose, tensor_check

# How far apart two float64 layer outputs may be, relative to the oracle's largest value,
# and still count as the same math where the diagnosis looks for the first layer to differ:
# 1e-10 is about 5e5 float64 ulps, far above the twins' rounding (1e-16 to 1e-14 measured on
# every layer kind, tests/test_layers_frameworks.py) and far below the smallest porting bug
# (an eps moved from 1e-5 to 1e-4: about 1e-6). It names a layer; it judges nothing.
LAYERS_APART = 1e-10


def first_layer_apart(twin: dict[str, np.ndarray], oracle: dict[str, np.ndarray], shared_only: bool = False) -> str | None:
    """The first layer, in the network's order, whose output differs from the oracle's.
    `shared_only` (a port's two modules, each named by its own code): only the modules the
    twin names as well, by module path, are compared, and the reference's modules passed
    over since the last one compared are said ("fc2, after act, which only the reference
    names": a function such as jax.nn.gelu is no flax module)."""
    passed: list[str] = []
    named = {port.torch_side(key): key for key in twin} if shared_only else {name: name for name in twin}
    for name, want in oracle.items():
        got = twin.get(named.get(name, name))
        if got is None and shared_only:
            passed.append(name)
            continue
        after = f", after {', '.join(passed)}, which only the reference names" if passed else ""
        if got is not None and got.shape != want.shape and shared_only:
            try:  # a port's outputs equal after broadcasting are equal (GPT-2's (1, T) position ids in torch, (B, T) in flax)
                got, want = np.broadcast_arrays(got, want)
            except ValueError:
                passed.append(name)  # a shape difference alone names no module
                continue
        if got is None or got.shape != want.shape:
            return name + after
        if np.abs(got - want).max(initial=0) > LAYERS_APART * max(np.abs(want).max(initial=0), np.finfo(np.float64).tiny):
            return named.get(name, name) + after
        passed = []
    return None


# A port's initial forward pass, judged before anything trains (initial_forward_check): torch's
# and flax's float64 outputs of step 0's batch further apart than float32's unit of rounding
# (2^-24), relative to the largest output, are different math. Float64 rounds 2^29 times
# finer: reaching it takes an amplification of 5e8. Measured on 300 honest ports of a seed
# never run before (docs/measurements.md, "A port's initial forward pass"): median 3.8e-16,
# max 4.7e-11 (1/1270 of it); the 89 slips there that change the forward pass, from 3.4e-6
# (57x). Below it nothing is passed: the calibrated checks judge the trained runs, so this
# can only fail early what they would fail later.
FORWARD_APART = 2.0**-24
FORWARD = f"{MATH}initial_forward"


def initial_forward_check(twin: RunKey, reference: RunKey, outputs: dict[str, dict[str, np.ndarray]]) -> Check:
    """flax's float64 forward pass of step 0's batch against torch's, from the port's initial
    tensors, before any run (adapters/jax_port_check.py initial_forward, by run label): FAIL
    where the whole module's outputs are further apart than FORWARD_APART of the largest,
    naming the first module whose outputs differ (first_layer_apart)."""
    got, want = outputs[twin.label], outputs[reference.label]
    rule = "max |a-b| <= 2^-24 * max |b| (float32's unit of rounding, in float64), the whole module's outputs on step 0's batch"
    a, b = got.get("output"), want.get("output")
    layer = first_layer_apart(got, want, shared_only=True)
    if a is None or b is None or a.shape != b.shape:
        shapes = f"{None if a is None else a.shape} vs {None if b is None else b.shape}"
        return Check(FORWARD, twin, reference, CheckVerdict.FAIL, rule, reason=f"outputs' shapes differ: {shapes}", forward_layer=layer)
    diff = float(np.abs(a - b).max(initial=0.0))
    scale = max(float(np.abs(b).max(initial=0.0)), np.finfo(np.float64).tiny)
    ratio = diff / (FORWARD_APART * scale)
    verdict = CheckVerdict.FAIL if ratio > 1 else CheckVerdict.PASS
    layer = layer if verdict == CheckVerdict.FAIL else None
    return Check(FORWARD, twin, reference, verdict, rule, diff, diff / scale, ratio=ratio, forward_layer=layer)


def math_parity_checks(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """A float64 twin against the oracle over the twins' first steps, calibrated on the
    oracle's own reordered members: a failure here is different math. A twin that diverged
    is judged over its finite steps (diverged_prefix)."""
    reference, spread = cal.reference_of(twin.key), cal.spread_of(twin.key)
    names = [f"{MATH}{n}" for n in ("initial_outputs", "initial_loss", "loss_curve", "final_outputs")]
    if reference is None or reference.status != "ok" or spread is None:
        reason = f"no float64 calibration: needs ok runs of {cal.reference_name}'s first steps and its reordered members"
        return skipped(names, twin.key, cal.reference, "math parity", reason)
    diverged = twin.status != "ok"  # rules.math_parity passes a failed twin only where it diverged
    if diverged:
        prefix = diverged_prefix(twin, reference, spread)
        if prefix is None:
            return []  # diverged at its first step: the divergence check alone judges it
        twin, reference, spread = prefix
    factor = spec.checks.long_run.factor
    eps = EPS[FLOAT64]
    checks = [dataclasses.replace(check, b=cal.reference) for check in short_horizon_checks(spec, twin, reference, spread, prefix=MATH)]
    checks.append(
        curve_check(
            f"{MATH}loss_curve",
            twin.key,
            cal.reference,
            twin.losses,
            reference.losses,
            factor,
            spread,
            loss_floor(reference.losses),
            f"relative loss difference <= {factor:g} * e64(t) + {ROUNDING_ULPS} * {eps:.3g} * max(1, 1/|loss|), e64(t) = "
            f"{spread_prose(spread.runs, FLOAT64, f' from {cal.reference_name}')} "
            f"(over the first {len(reference.losses)} steps; final e64 = {spread.curve[-1]:.3g})",
        )
    )
    if diverged:  # no final outputs, nor the snapshots it did not keep finite
        steps = sorted({1, spec.checks.params_after_steps.step} & set(reference.snapshots) - set(twin.snapshots))
        gone = [f"{MATH}params_after_step_{step}" for step in steps]
        said = f"{twin.reason}; judged over its finite steps"
        checks.extend(skipped([*gone, f"{MATH}final_outputs"], twin.key, cal.reference, "math parity", said))
    elif spread.diverged:  # a member diverged: nothing after its divergence is bounded
        checks.extend(skipped([f"{MATH}final_outputs"], twin.key, cal.reference, "math parity", spread.unbounded))
    else:
        checks.append(
            tensor_check(
                f"{MATH}final_outputs",
                twin.key,
                cal.reference,
                [twin.final_outputs],
                [reference.final_outputs],
                [spread.final_outputs],
                factor,
                spread,
            )
        )
    shared_only = cal.reference.framework != ORACLE  # a port: torch's modules against flax's, by path
    layer = first_layer_apart(twin.layer_outputs, reference.layer_outputs, shared_only) if reference.layer_outputs else None
    return [dataclasses.replace(c, forward_layer=layer) for c in checks] if layer else checks


def diverged_prefix(twin: Outcome, reference: Outcome, spread: Spread) -> tuple[Outcome, Outcome, Spread] | None:
    """A twin that diverged (a non-finite loss or tensor at its `failed_at_step`), cut to the
    steps it kept finite, with the reference and the members' spread cut alike: its first
    loss and outputs, the snapshots it kept finite and its curve up to its divergence are
    judged as any twin's (a difference of math shows before a divergence as well as without
    one). None where it diverged at its first step."""
    steps = min(int(twin.failed_at_step), len(reference.losses), len(spread.curve))
    if steps < 1 or twin.initial_outputs is None or not np.isfinite(twin.initial_outputs).all():
        return None
    kept = {s: p for s, p in twin.snapshots.items() if s <= twin.failed_at_step and all(np.isfinite(v).all() for v in p.values())}
    cut = dataclasses.replace(twin, losses=twin.losses[:steps], snapshots=kept)
    return cut, dataclasses.replace(reference, losses=reference.losses[:steps]), dataclasses.replace(spread, curve=spread.curve[:steps])


def anchored_parity_check(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """The twin re-anchored along the run (harness/run/anchored.py): over each segment,
    started from the oracle's state, against the oracle's own steps from it, calibrated on
    the float64 members started from the same state. The first segment to fail is where
    the difference starts."""
    name = f"{ANCHORED_CHECKS}loss_curve"
    run, segments = cal.anchored.get((twin.key.framework, twin.key.device)), cal.segments_of(twin.key)
    if run is None and segments is None:
        return []  # a run too short for a segment after the first steps
    rule = f"math parity re-anchored at {cal.reference_name}'s state"
    if run is not None and run.status != "ok":
        return [Check(name, twin.key, cal.reference, CheckVerdict.FAIL, rule, reason=run.reason, first_failure_step=run.failed_at_step)]
    if run is None or segments is None or cal.float64 is None or sorted(run.segments) != sorted(segments.reference):
        return skipped(
            [name], twin.key, cal.reference, rule, f"no calibrated segments: needs {cal.reference_name}'s states and its members' re-anchored runs"
        )
    factor = spec.checks.long_run.factor
    references = segments.reference
    library = cal.library.get((twin.key.framework, twin.key.device))
    if library is not None:  # the oracle computing the library's formula, from the same states
        if library[1] is None or library[1].status != "ok" or sorted(library[1].segments) != sorted(references):
            return skipped([name], twin.key, cal.reference, rule, "the oracle computing the library's formula did not run every segment")
        references = library[1].segments
    found = []
    for start, reference in sorted(references.items()):
        spread = dataclasses.replace(cal.float64, curve=segments.curve[start], runs=segments.runs, diverged={})  # the segment's own spread
        check = curve_check(name, twin.key, cal.reference, run.segments[start], reference, factor, spread, loss_floor(reference), rule)
        step = None if check.first_failure_step is None else start + check.first_failure_step
        found.append(dataclasses.replace(check, first_failure_step=step, horizon_steps=None, segment=start))
    chosen = _first_failing_or_worst(found)
    starts = ", ".join(str(a) for a in sorted(segments.reference))
    tolerance = (
        f"over each segment of {spec.checks.math_parity.steps} steps from {cal.reference_name}'s state at steps {starts}: relative loss "
        f"difference <= {factor:g} * e64(t) + {ROUNDING_ULPS} * {EPS[FLOAT64]:.3g} * max(1, 1/|loss|), e64(t) = "
        f"{spread_prose(segments.runs, FLOAT64, ', started from the same state')}"
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
    failing = [c for c in found if c.verdict == CheckVerdict.FAIL]
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
    spread = dataclasses.replace(cal.float64, runs=segments.runs, diverged={})  # the segments' members, every one of which ran
    states, outputs = [], []
    for a in starts:
        reference, mine = segments.end_reference[a], run.segment_ends[a]
        missing = [n for n in reference if "/" not in n and n not in mine]
        if missing:
            reason = f"it carries no {', '.join(missing)}"
            states.append(Check(f"{ANCHORED_CHECKS}state", twin.key, cal.reference, CheckVerdict.FAIL, "every tensor", reason=reason, segment=a))
        else:
            # every tensor the reference and its members kept, and the optimizer moments the
            # run carries too (an adapter without training_state carries none)
            names = [n for n in reference if n in segments.end_params[a] and n in mine]
            check = tensor_check(
                f"{ANCHORED_CHECKS}state",
                twin.key,
                cal.reference,
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
            f"{ANCHORED_CHECKS}outputs",
            twin.key,
            cal.reference,
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
