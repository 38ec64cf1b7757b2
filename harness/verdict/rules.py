"""The verdict rules, as objects in one list. Each rule names the runs it judges together
(a pair of float32 runs, or one float64 twin against the oracle's first steps) and makes
its checks over them (harness/verdict/checks.py measures each one); every check it makes
carries the rule's name and its tolerance as fields (`checks.Bound`). A new kind of
verdict is one more entry in RULES, not a fork of an existing rule.

Which runs are judged together:
- float32 pairs: every pair of successful strict float32 runs, each against the oracle and
  against each other, the oracle always the reference (b). A TF32 run is judged against the
  oracle only: what TF32 costs in agreement, not a cross product of expected failures.
- twins: each float64 twin, against the oracle over the twins' first steps.
- diverged float32 runs: each float32 run that diverged, against the oracle where it trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations
from typing import Protocol

from harness.calibrate.spread import Calibration, Spread
from harness.core.registry import (
    BF16,
    BF16_MEMBER_KEY,
    CALIBRATION_KEY,
    CALIBRATION_PAIRS,
    DIVERGENCE_CHECKS,
    FLOAT64,
    ORACLE_KEY,
    STRICT,
    CheckVerdict,
    RunKey,
)
from harness.run.runner import Outcome
from harness.spec import catalogue
from harness.spec.model import Spec
from harness.verdict.bound import Bound
from harness.verdict.checks import NO_CALIBRATION, Check, curve_check, envelope_checks, horizon_check, short_horizon_checks, skipped
from harness.verdict.parity import anchored_parity_check, math_parity_checks

FLOAT32_PAIRS = "float32 pairs"
NO_BF16 = f"no bf16 calibration: needs ok runs of {BF16_MEMBER_KEY.label} (and its members) and the reference"
TWINS = "twins"
DIVERGED = "diverged float32 runs"


class Rule(Protocol):
    name: str
    over: str  # FLOAT32_PAIRS or TWINS: which runs it judges together

    def judge(self, spec: Spec, runs: tuple[Outcome, ...], cal: Calibration) -> list[Check]: ...


@dataclass(frozen=True)
class PairRule:
    """A rule over two float32 runs (b the reference), calibrated on the float32 members."""

    name: str
    measure: Callable[[Spec, Outcome, Outcome, Spread | None], list[Check]]
    over: str = FLOAT32_PAIRS

    def judge(self, spec: Spec, runs: tuple[Outcome, ...], cal: Calibration) -> list[Check]:
        a, b = runs
        if BF16 not in (a.key.precision, b.key.precision):
            return self.measure(spec, a, b, cal.float32)
        found = self.measure(spec, a, b, cal.bf16)
        return [dataclasses.replace(c, reason=NO_BF16) if c.reason == NO_CALIBRATION else c for c in found]


@dataclass(frozen=True)
class TwinRule:
    """A rule over one float64 twin, against the oracle's first steps."""

    name: str
    measure: Callable[[Spec, Outcome, Calibration], list[Check]]
    over: str = TWINS

    def judge(self, spec: Spec, runs: tuple[Outcome, ...], cal: Calibration) -> list[Check]:
        (twin,) = runs
        return self.measure(spec, twin, cal)


def spec_horizon(spec: Spec, a: Outcome, b: Outcome, cal: Spread | None) -> list[Check]:
    """The spec's own horizon rule, where it states one: the loss curves within rtol over
    the first steps. A float32 tolerance: a bf16 run is judged on the bf16 envelope alone."""
    if spec.checks.loss_curve is None:
        return []
    if BF16 in (a.key.precision, b.key.precision):
        return skipped(["loss_curve_horizon"], a.key, b.key, "the spec's rule", "the spec's rtol is float32's; bf16 is judged on its envelope")
    return [horizon_check(spec, a.key, b.key, a.losses, b.losses)]


def math_parity(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """A float64 twin against the oracle over the twins' first steps, calibrated on the
    oracle's own reordered members: a failure here is different math. A twin that diverged
    is judged over the steps it kept finite, beside its divergence check; one that raised is
    not judged."""
    return math_parity_checks(spec, twin, cal) if twin.status == "ok" or twin.failed_at_step is not None else []


def divergence_check(name: str, run: Outcome, reference: RunKey, reference_name: str, spread: Spread | None) -> Check:
    """A run that diverged where the reference trained: different math, unless rounding alone
    diverges the training as early (a member summing in another order diverged at or
    before the run's step: Spread.diverged)."""
    rule = f"a run trains wherever {reference_name} does, or diverges no earlier than the first of its members summing in other orders"
    first = None if spread is None else spread.finite_steps
    if first is not None and run.failed_at_step >= first:
        return Check(name, run.key, reference, CheckVerdict.PASS, rule, reason=f"{run.reason}; {spread.unbounded}")
    return Check(name, run.key, reference, CheckVerdict.FAIL, rule, first_failure_step=run.failed_at_step, reason=run.reason)


def twin_divergence(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """A float64 twin trains wherever the oracle does: one that stops on a non-finite value
    where the oracle's first steps ran is different math, unless the oracle's reordered
    members diverged as early; `known`, naming the entries, where the twin is judged against
    the oracle computing its library's catalogued formula and that reference diverges no
    later (optax's SGD without dampening taking larger steps: port text seed 20261608, draw 8)."""
    reference_ok = cal.twin_reference is not None and cal.twin_reference.status == "ok"
    if twin.failed_at_step is None or not reference_ok:
        return []
    check = divergence_check(DIVERGENCE_CHECKS[1], twin, cal.reference, cal.reference_name, cal.spread_of(twin.key))
    library = cal.library.get((twin.key.framework, twin.key.device))
    formula = library[0] if library is not None else None
    if check.verdict != CheckVerdict.FAIL or formula is None or formula.failed_at_step is None or formula.failed_at_step > twin.failed_at_step:
        return [check]
    # judged against the reference computing its library's catalogued formula, which diverges
    # no later: that formula's dynamics, not other math (optax's SGD without dampening)
    ids = ", ".join(entry.id for entry in catalogue.formula_entries(spec, twin.key))
    said = f"{formula.key.label}, {cal.reference_name} computing {ids}, diverges at step {formula.failed_at_step}"
    return [dataclasses.replace(check, verdict=CheckVerdict.KNOWN, reason=f"{twin.reason}; {said}", diagnosis=f"known ({ids})")]


def float32_divergence(spec: Spec, a: Outcome, b: Outcome, cal: Spread | None) -> list[Check]:
    """A float32 run that diverged where the reference `b` trained: its finite steps within
    the envelope, and its divergence no earlier than the first float32 member's."""
    if cal is None:
        return skipped([DIVERGENCE_CHECKS[0]], a.key, b.key, "divergence rule", NO_CALIBRATION)
    rule = spec.checks.long_run
    finite = min(int(a.failed_at_step), len(cal.curve))
    checks = []
    if finite and {a.key, b.key} not in CALIBRATION_PAIRS:  # numpy@cpu's own steps make the envelope
        prefix = dataclasses.replace(cal, curve=cal.curve[:finite], diverged={})
        tolerance = (
            f"relative loss difference <= {rule.factor:g} * e(t) + {rule.curve_floor:g}, e(t) = {cal.dtype}-vs-float64 distance, "
            f"max of {cal.runs} runs, over the run's finite steps 0-{finite - 1}"
        )
        la, lb = a.losses[:finite], b.losses[:finite]
        checks.append(curve_check("loss_curve_envelope", a.key, b.key, la, lb, rule.factor, prefix, rule.curve_floor, tolerance))
    return [*checks, divergence_check(DIVERGENCE_CHECKS[0], a, b.key, cal.around, cal)]


def anchored_parity(spec: Spec, twin: Outcome, cal: Calibration) -> list[Check]:
    """A float64 twin re-anchored at the oracle's state along the run, segment by segment
    (harness/run/anchored.py): math parity where the first steps cannot see."""
    return anchored_parity_check(spec, twin, cal) if twin.status == "ok" else []


# short_horizon: outputs and loss at step 0, parameters after step 1 and after step k, per
# tensor; envelope: the loss at every step, the final outputs and each final metric.
RULES: tuple[Rule, ...] = (
    PairRule("short_horizon", short_horizon_checks),
    PairRule("loss_curve_horizon", spec_horizon),
    PairRule("envelope", envelope_checks),
    TwinRule("math_parity", math_parity),
    TwinRule("twin_divergence", twin_divergence),
    TwinRule("anchored_math_parity", anchored_parity),
    PairRule("float32_divergence", float32_divergence, over=DIVERGED),
)


def judged_pair(a: RunKey, b: RunKey, reference: RunKey = ORACLE_KEY) -> bool:
    """Whether two float32 runs are judged against each other (a float64 twin is judged by
    math parity alone; a TF32 run against the reference only; a bf16 run against the
    reference and its own framework's float32 run). The reference (the oracle, or a port's
    torch float64 run) is judged against every float32 run."""
    if any(k.precision == FLOAT64 and k != reference for k in (a, b)):
        return False
    return (a.precision == STRICT and b.precision == STRICT) or reference in (a, b) or _own_float32(a, b)


def _own_float32(a: RunKey, b: RunKey) -> bool:
    """A bf16 run and its framework's strict float32 run on the same device, in the same mode."""
    same = (a.framework, a.device, a.mode, a.variant) == (b.framework, b.device, b.mode, b.variant)
    return same and {a.precision, b.precision} == {BF16, STRICT}


def groups(over: str, outcomes: dict[RunKey, Outcome], reference: RunKey = ORACLE_KEY) -> list[tuple[Outcome, ...]]:
    """The runs each rule `over` that kind judges together, in a fixed order."""
    if over == TWINS:
        return [(o,) for o in outcomes.values() if o.key.precision == FLOAT64 and o.key != reference]
    if over == DIVERGED:
        ref = outcomes.get(reference)
        if ref is None or ref.status != "ok":
            return []
        return [(o, ref) for o in outcomes.values() if o.key.precision != FLOAT64 and o.key != reference and o.diverged]
    ok = sorted((o for o in outcomes.values() if o.status == "ok"), key=lambda o: o.key == reference)  # the reference last: b
    pairs = [(a, b) for a, b in combinations(ok, 2) if judged_pair(a.key, b.key, reference)]
    return [(b, a) if b.key.precision == BF16 and a.key != reference else (a, b) for a, b in pairs]  # a bf16 run is judged: a


def _stamped(rule: Rule, checks: Iterable[Check], cal: Calibration | None = None) -> list[Check]:
    """Each check with the rule that made it named in its bound; a check skipped for want
    of a calibration names the calibration run of `cal`'s scheme (cupy@gpu where the
    references ran on the GPU)."""
    found = [dataclasses.replace(c, bound=dataclasses.replace(c.bound or Bound("", "none"), rule=rule.name)) for c in checks]
    if cal is None or cal.member == CALIBRATION_KEY:
        return found
    named = NO_CALIBRATION.replace(CALIBRATION_KEY.label, cal.member.label)
    return [dataclasses.replace(c, reason=named) if c.reason == NO_CALIBRATION else c for c in found]


def check_all(spec: Spec, outcomes: dict[RunKey, Outcome], cal: Calibration, rules: tuple[Rule, ...] = RULES) -> list[Check]:
    """Every rule's checks over the runs it judges, as measured: known differences and
    diagnoses are applied by harness.verdict.diagnosis.verdicts. The checks of one group
    of runs stand together, in the order of the rules."""
    found = []
    for over in (FLOAT32_PAIRS, TWINS, DIVERGED):
        for runs in groups(over, outcomes, cal.reference):
            for rule in rules:
                if rule.over == over:
                    found.extend(_stamped(rule, rule.judge(spec, runs, cal), cal))
    return found


def pair_checks(spec: Spec, a: Outcome, b: Outcome, cal: Calibration) -> list[Check]:
    """Every check of float32 run a against run b (b is the reference where it is the oracle)."""
    return [c for rule in RULES if rule.over == FLOAT32_PAIRS for c in _stamped(rule, rule.judge(spec, (a, b), cal), cal)]
