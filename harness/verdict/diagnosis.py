"""Why a check fails: known differences first, then a diagnosis on every failing check.

- `known: ...`: a known difference covers it, from the spec or from the library file
  (harness/known_differences.yaml, entries keyed by framework, library version range,
  optimizer, loss, device and mode).
- `implementation`: the float64 twin of a run in the pair differs from the oracle too:
  the frameworks compute different math.
- `rounding`: the twins agree with the oracle; only float32 differs, by the given ratio to
  the calibrated tolerance.
- `undiagnosed`: a twin that would tell did not run (said why).

Each diagnosis also says where the failure starts: the first step, and the parameter
tensor whose difference (over its tolerance) is largest at the earliest snapshot.
"""

from __future__ import annotations

import dataclasses
import math
from fnmatch import fnmatchcase

import numpy as np

from harness.calibrate.spread import Calibration
from harness.core.registry import BF16, FLOAT32, FLOAT64, JOINED, ORACLE, ORACLE_KEY, TF32, CheckVerdict, RunKey, explains
from harness.spec import catalogue
from harness.spec.known import KnownDifference, LibraryDifference
from harness.spec.model import Spec
from harness.verdict import bf16, defects
from harness.verdict.bound import times_tolerance
from harness.verdict.checks import MATH, Check
from harness.verdict.parity import initial_forward_check
from harness.verdict.rules import check_all, pair_checks

FLOAT32_ROUNDING = "rounding: float32 only"  # how _diagnosis begins where on_rounding_alone is true


def covers(entry: KnownDifference, check: Check, reference: RunKey = ORACLE_KEY) -> bool:
    """Whether an entry explains a check: its name, framework, device and mode. Math parity
    (the float64 twins) is never covered: where a library's math differs, its twin is
    judged against the oracle computing the library's formula. A port's reference, torch's
    float64 run, computes torch's catalogued formulas: torch's entries also cover a check
    of another library's float32 run against it. A bf16 run's check is never covered: the
    entries are float32's and float64's, bounded by members of those precisions."""
    if check.name.startswith(MATH) or not any(fnmatchcase(check.name, p) for p in entry.patterns):
        return False
    if BF16 in (check.a.precision, check.b.precision):
        return False
    sides = (check.a, check.b)
    if any(k.framework == entry.framework and k.device in entry.devices and k.mode in entry.modes and k.precision != FLOAT64 for k in sides):
        return True
    ours = entry.framework == reference.framework and reference.device in entry.devices and reference.mode in entry.modes
    return ours and reference in sides and any(k.precision != FLOAT64 for k in sides)


def _label(entry: KnownDifference) -> str:
    return entry.id if isinstance(entry, LibraryDifference) else f"{entry.framework}/{entry.check or entry.patterns[0]}"


BEYOND = "beyond what"  # how a covered check a library entry cannot explain is marked, before its diagnosis
NO_MEMBERS = "no members computing its behaviour ran"  # ... where its library's float32 members did not run


def reach(spec: Spec, outcomes: dict, cal: Calibration) -> dict[str, dict[str, float]]:
    """How far each library's catalogued behaviour carries a float32 run from the oracle, by
    framework and check: the largest ratio to its tolerance that the float32 members
    computing that behaviour (Calibration.library32) reach on each check against the oracle.
    A framework whose members did not all run reaches nothing."""
    oracle = outcomes.get(cal.reference)  # the oracle, or a port's torch float64 run
    found: dict[str, dict[str, float]] = {}
    if oracle is None or oracle.status != "ok":
        return found
    for framework, members in cal.library32.items():
        if not members or any(m.status != "ok" for m in members):
            continue
        worst: dict[str, float] = {}
        for member in members:
            for c in pair_checks(spec, member, oracle, cal):
                if c.ratio is not None and math.isfinite(c.ratio):
                    worst[c.name] = max(worst.get(c.name, 0.0), c.ratio)
        found[framework] = worst
    return found


def lying_with(spec: Spec, outcomes: dict, cal: Calibration) -> dict[tuple[RunKey, str], tuple[float, RunKey]]:
    """Where a library's float32 runs lie against the reference computing that library's
    formula over the whole run, in float64 (Calibration.library_whole, run only where a
    check failed beyond its entry's reach): each run's checks against it, by (run, check),
    as (ratio to the check's own tolerance, that reference's key)."""
    found: dict[tuple[RunKey, str], tuple[float, RunKey]] = {}
    for framework, whole in cal.library_whole.items():
        if whole.status != "ok":
            continue
        for key, run in outcomes.items():
            if key.framework != framework or key.precision == FLOAT64 or key.variant or run.status != "ok":
                continue
            for c in pair_checks(spec, run, whole, cal):
                if c.ratio is not None and math.isfinite(c.ratio):
                    found[key, c.name] = (c.ratio, whole.key)
    return found


def _lies_with_its_formula(check: Check, lying: dict, reference: RunKey) -> tuple[float, RunKey] | None:
    """Where a check beyond its entry's reach is explained all the same: each of its sides is
    the reference, a run of the reference's own library (rounding alone, judged by its own
    checks), or a run that passes this check against the reference computing its library's
    formula over the whole run (lying_with). The largest such ratio and that reference; None
    where a side is none of these."""
    worst: tuple[float, RunKey] | None = None
    for side in (check.a, check.b):
        if side == reference or side.framework in (ORACLE, reference.framework):
            continue
        found = lying.get((side, check.name))
        if found is None or found[0] > 1:
            return None
        worst = found if worst is None or found[0] > worst[0] else worst
    return worst


def _bounded_by_members(side: RunKey, entries: list, reference: RunKey) -> bool:
    """Whether what a check may reach on `side` is its library's float32 members' reach
    (_explained): a side other than the oracle, the reference or a run of the reference's
    own library, covered by a library entry of its own library or of the reference's (a
    port's reference computes its own library's formulas: an entry of that library carries
    the other libraries' runs from it, as far as their members computing their formula as
    the reference stands for them reach, roles.standing_for)."""
    if side.framework in (ORACLE, reference.framework) or side == reference:
        return False
    carrying = (side.framework, reference.framework)
    return any(isinstance(e, LibraryDifference) and e.framework in carrying for e in entries)


def _explained(spec: Spec, check: Check, entries: list, reached: dict[str, dict[str, float]], reference: RunKey = ORACLE_KEY) -> float:
    """The largest ratio a check may reach and stay explained by `entries` (those of its
    sides' libraries that cover it): by the triangle inequality, the sum over its sides
    other than the oracle of factor times what that side's library members reach on this
    check (an uncovered side: its own tolerance, 1). 0 where a covered side's members did
    not run: an entry explains nothing it has not measured. A side of the reference's own
    library (a port's torch runs, whose reference is torch's float64 run) computes what the
    reference computes: rounding alone, its own tolerance."""
    factor, total = spec.checks.long_run.factor, 0.0
    for side in (check.a, check.b):
        if side.framework == ORACLE or side == reference:
            continue
        if not _bounded_by_members(side, entries, reference):
            total += 1.0
            continue
        ratio = reached.get(side.framework, {}).get(check.name)
        if ratio is None:
            return 0.0
        total += factor * ratio
    return total


def _applying(spec: Spec) -> list[KnownDifference]:
    """The known differences that apply to a spec: its own, and the library file's whose keys match."""
    return [e for e in (*spec.known_differences, *catalogue.library_differences()) if catalogue.applies(e, spec)]


def apply_known_differences(
    spec: Spec,
    checks: list[Check],
    reached: dict[str, dict[str, float]] | None = None,
    reference: RunKey = ORACLE_KEY,
    lying: dict[tuple[RunKey, str], tuple[float, RunKey]] | None = None,
) -> list[Check]:
    """Mark explained failures 'known', as far as their entries reach; report a strict entry
    that no longer fails as a failure. A spec's own entry covers the checks it names; a
    library entry (harness/known_differences.yaml) covers a failing check only up to what
    the float32 members computing its library's behaviour reach on that check (`reached`,
    see reach): beyond that, the check fails and says so, and diagnose() says why as for
    any failing check (implementation where a twin differs from its reference), unless its
    library's side passes the check against the reference computing that library's formula
    over the whole run (`lying`, see lying_with): then it is known, saying so."""
    entries = _applying(spec)
    # a side whose float64 twin fails math parity computes other math than its reference: no
    # catalogued behaviour explains that, so its failing float32 checks stay failures and
    # diagnose() says implementation (a library entry's bound is in float32 rounding's units,
    # and a real bug of the same size would hide inside it)
    differing = {side for side, failed in _parity(checks).items() if failed and side != (reference.framework, reference.device)}
    marked = []
    for check in checks:
        covering = [e for e in entries if covers(e, check, reference)]
        if any((side.framework, side.device) in differing for side in (check.a, check.b) if side.precision != FLOAT64):
            covering = [e for e in covering if not isinstance(e, LibraryDifference)]
        if covering and check.verdict == CheckVerdict.FAIL:
            known = covering[0]
            library = [e for e in covering if isinstance(e, LibraryDifference)]
            bound = _explained(spec, check, covering, reached or {}, reference) if library else None
            named = sorted({_label(e) for e in library})
            ids = f"{', '.join(named)} {'explain' if len(named) > 1 else 'explains'}"
            beyond_reach = bound is not None and (check.ratio is None or check.ratio > bound)
            # past its members' reach, the last look may still place the run where its library's formula lies
            lies = _lies_with_its_formula(check, lying or {}, reference) if beyond_reach and bound else None
            if beyond_reach and lies is None:
                # it fails, and diagnose() says why as for any failing check (the twin tells
                # implementation from rounding), then how far beyond the entry it is
                beyond = NO_MEMBERS if bound == 0 else f"{(check.ratio or math.inf) / bound:.3g}x"
                reach_text = "" if bound == 0 else f"; the float32 members computing it reach {bound:.3g}x the tolerance"
                check = dataclasses.replace(check, diagnosis=f"{BEYOND} {ids} ({beyond}{reach_text})")
            else:
                if lies is not None:
                    ratio, whole = lies
                    said = (
                        f"{', '.join(named)}; beyond its members' reach, {ratio:.2g} of its tolerance from {whole.label}, "
                        "the library's formula over the whole run"
                    )
                else:
                    # the library entries together: their members compute every one of them at once
                    who = JOINED.join(named) if library else _label(known)
                    said = who + ("" if bound is None else f", {check.ratio / bound:.2g} of what {explains(who)}")
                reason = "; ".join(f"{_label(e)}: {e.reason}" for e in sorted(library, key=_label)) if len(named) > 1 else known.reason
                check = dataclasses.replace(check, verdict=CheckVerdict.KNOWN, reason=f"known difference: {reason}", diagnosis=f"known ({said})")
        marked.append(check)
    for known in entries:
        judged = [c for c in checks if covers(known, c, reference) and c.verdict != CheckVerdict.SKIPPED]
        if known.strict and judged and not any(c.verdict == CheckVerdict.FAIL for c in judged):
            first = judged[0]
            marked.append(
                Check(
                    "known_difference_absent",
                    first.a,
                    first.b,
                    CheckVerdict.FAIL,
                    f"lists {_label(known)} as a known difference",
                    reason="the listed difference did not occur: remove it from known_differences",
                    diagnosis="stale known difference",
                )
            )
    return marked


def _parity(checks: list[Check]) -> dict[tuple[str, str], list[Check]]:
    """(framework, device) of each float64 twin -> its failing math-parity checks."""
    parity: dict[tuple[str, str], list[Check]] = {}
    for c in checks:
        if c.a.precision == FLOAT64 and c.verdict != CheckVerdict.SKIPPED:
            parity.setdefault((c.a.framework, c.a.device), [])
            if c.verdict == CheckVerdict.FAIL:
                parity[(c.a.framework, c.a.device)].append(c)
    return parity


def _where(check: Check, pair: list[Check], ref: str = "the oracle") -> str:
    """Where a failure starts: its first step, and the tensor whose ratio is largest at the
    earliest parameter snapshot of the same pair."""
    parts = []
    if check.first_failure_step is not None:
        parts.append(f"starts at step {check.first_failure_step}")
    if check.segment is not None and check.verdict != CheckVerdict.PASS:
        parts.append(f"in the segment re-anchored at step {check.segment} (the twin started from {ref}'s state there)")
    if check.segment is not None:  # late in the run: the first steps' snapshots say nothing of it
        if check.tensor and check.verdict != CheckVerdict.PASS:
            parts.append(f"largest in {check.tensor} at the segment's end ({times_tolerance(check.ratio)})")
        return "; ".join(parts)
    snapshots = sorted(
        (c for c in pair if c.tensor and c.name.removeprefix(MATH).startswith("params_after_step_")),
        key=lambda c: int(c.name.rsplit("_", 1)[1]),
    )
    grown = next((c for c in snapshots if c.verdict != CheckVerdict.PASS), snapshots[0] if snapshots else None)
    if grown is not None:
        step = grown.name.rsplit("_", 1)[1]
        if grown.verdict == CheckVerdict.PASS:  # no snapshot differs past its tolerance: the drift comes later
            parts.append(f"the parameters agree after step {step} (largest in {grown.tensor}: {times_tolerance(grown.ratio)})")
        else:
            parts.append(f"largest in {grown.tensor} after step {step} ({times_tolerance(grown.ratio)})")
    return "; ".join(parts)


def _forward(check: Check) -> str:
    """Where a twin's forward pass first differs from its reference's, if it does: at a
    layer of the spec, or at a module of a port (named by its path)."""
    if check.forward_layer is None:
        return ""
    what = "layer" if check.b.framework == ORACLE else "module"
    return f"; its forward pass first differs at {what} {check.forward_layer} (the first batch)"


def start_check(twin: RunKey, reference: RunKey, outputs: dict[str, dict[str, np.ndarray]]) -> Check:
    """A port's initial forward pass before any run (parity.initial_forward_check), diagnosed
    where it fails."""
    check = initial_forward_check(twin, reference, outputs)
    if check.verdict != CheckVerdict.FAIL:
        return check
    how = f"outputs {check.max_rel_error:.3g} apart, {check.ratio:.3g}x float32's unit of rounding" if check.ratio is not None else check.reason
    said = f"implementation: flax's float64 forward pass differs from torch's before any training ({how}): different math, not rounding"
    return dataclasses.replace(check, diagnosis=said + _forward(check))


def _over(check: Check) -> str:
    """How far past its tolerance a check is: "2.5x the calibrated tolerance", or the spec's
    own (an override), or past a tolerance of zero; "" where it has no ratio."""
    if check.ratio is None:
        return ""
    whose = "the calibrated tolerance" if check.bound is None or check.bound.factor is not None else "the spec's tolerance"
    return times_tolerance(check.ratio, whose)


def _diagnosis(check: Check, parity: dict[tuple[str, str], list[Check]], reference: RunKey = ORACLE_KEY, placed: dict | None = None) -> str:
    ratio = _over(check)
    ref = "the oracle" if reference.framework == ORACLE else reference.label
    if check.name.startswith(MATH):
        how = f" ({ratio})" if ratio else f" ({check.reason})" if check.reason else ""
        return f"implementation: the float64 twin differs from {ref}{how}: different math, not rounding{_forward(check)}"
    if check.name == "known_difference_absent":
        return check.diagnosis or "stale known difference"
    # the reference's own code (a port's torch) is its own twin
    sides = [k for k in (check.a, check.b) if k.framework != ORACLE and (k.framework, k.device) != (reference.framework, reference.device)]
    bad = [(k, parity[(k.framework, k.device)]) for k in sides if parity.get((k.framework, k.device))]
    if bad:
        key, failing = bad[0]
        worst = max(failing, key=lambda c: c.ratio or 0)
        how = times_tolerance(worst.ratio) if worst.ratio is not None else worst.reason  # a twin that diverged has no ratio
        return f"implementation: the float64 twin of {key.framework}@{key.device} differs from {ref} too ({worst.name}, {how}){_forward(worst)}"
    missing = [f"{k.framework}@{k.device}" for k in sides if (k.framework, k.device) not in parity]
    if missing:
        return f"undiagnosed: no float64 twin of {', '.join(missing)} was judged"
    modes = " (eager; the fast mode has no twin)" if any(k.mode != "eager" for k in sides) else ""
    if any(k.precision == TF32 for k in sides):  # judged against float32's spread, and not gated
        return f"rounding: TF32, products of 10-bit mantissas as --tf32 allows, {ratio} of float32; the float64 twins agree with {ref}{modes}"
    if any(k.precision == BF16 for k in sides):  # judged against bf16's envelope, and not gated
        envelope = f"{ratio or check.reason} (bf16's envelope: torch.autocast's runs summing in other orders); the float64 twins agree with {ref}"
        apart = [f"{k.framework} computes {', '.join(placed[k])} in bfloat16" for k in sides if k in (placed or {})]
        if apart:  # a bf16-only bug: a loss, or a sum torch promotes, taken in bfloat16
            return f"rounding: bf16 where torch's autocast keeps float32 ({'; '.join(apart)}), {envelope}"
        how = ", ".join(f"{k.framework}: {bf16.WHERE[k.framework]}" for k in sides if k.precision == BF16)
        return f"rounding: bf16 ({how}), {envelope}"
    return f"{FLOAT32_ROUNDING}, {ratio or check.reason}; the float64 twins agree with {ref}{modes}"  # a divergence has no ratio


def on_rounding_alone(checks: list[Check]) -> list[Check]:
    """The failing float32 checks whose float64 twins agree with the oracle, judged on the
    calibrated envelope (not a spec's own tolerance, nor a TF32 run's): those the
    envelope's second look (harness/matrix.py) judges again on more members."""
    return [
        c
        for c in checks
        if c.verdict == CheckVerdict.FAIL
        and (c.diagnosis or "").startswith(FLOAT32_ROUNDING)
        and c.bound is not None
        and c.bound.factor is not None
        and c.bound.dtype == FLOAT32
    ]


def beyond_entries(checks: list[Check]) -> list[Check]:
    """The failing float32 checks on rounding alone that library entries cover but do not
    explain as far as their members reach (apply_known_differences): those whose library's
    formula the last look runs over the whole run (harness/calibrate/calibration.py
    library_whole)."""
    return [c for c in on_rounding_alone(checks) if _past_members_reach(c)]


def beyond_reach(checks: list[Check]) -> list[Check]:
    """The failing checks that library entries cover but do not explain as far as the float32
    members computing their library's behaviour reach, those members having run
    (apply_known_differences): those the rest of those members judge again
    (harness/calibrate/calibration.py library_top_up)."""
    return [c for c in checks if c.verdict == CheckVerdict.FAIL and _past_members_reach(c)]


def _past_members_reach(check: Check) -> bool:
    """Marked beyond what its library entries explain, by members that ran
    (apply_known_differences), and not a measured library defect (no member explains one)."""
    said = check.diagnosis or ""
    return f"{BEYOND} " in said and NO_MEMBERS not in said and not said.startswith(defects.DEFECT)


def library_known(spec: Spec, check: Check, reference: RunKey = ORACLE_KEY) -> bool:
    """Whether a float32 check against the oracle's scheme is known by library entries alone
    (harness/known_differences.yaml), none of them strict, as far as its library's members
    reach: the rest of the envelope's members (harness/calibrate/calibration.py top_up) are
    not run for it, and it stays known. They could make it pass; they widen each tensor's
    and step's tolerance unevenly, so that one fails is possible in principle, and was
    measured instead: of 101 such checks on 200 fresh generated workloads, every member left
    99 known and 2 passing (docs/measurements.md, 2026-12-02); on a port (torch's float64 run
    the reference), of 100 fresh ports, 96 had the same counts either way and 4 had 12
    checks known that every member passes, none failing (2026-12-07). A check a spec's own
    entry or a strict one covers is judged on every member (a strict entry that no longer
    fails is a failure)."""
    if check.verdict != CheckVerdict.KNOWN or check.a.precision == FLOAT64:
        return False
    entries = _applying(spec)
    covering = [e for e in entries if covers(e, check, reference)]
    return bool(covering) and all(isinstance(e, LibraryDifference) and not e.strict for e in covering)


def unmeasured_libraries(spec: Spec, checks: list[Check], reference: RunKey = ORACLE_KEY) -> dict[str, list[Check]]:
    """The libraries whose float32 members computing their catalogued behaviour a failing
    check needs and none of which ran (apply_known_differences: "no members computing its
    behaviour ran"), each with those checks: the frameworks of its float32 sides whose
    reach bounds what its covering library entries explain (_explained). The library look
    runs their members (harness/calibrate/calibration.py library_look), then every check is
    judged again."""
    entries = [e for e in catalogue.library_differences() if catalogue.applies(e, spec)]
    found: dict[str, list[Check]] = {}
    for check in checks:
        if check.verdict != CheckVerdict.FAIL or NO_MEMBERS not in (check.diagnosis or ""):
            continue
        covering = [e for e in entries if covers(e, check, reference)]
        for side in (check.a, check.b):
            if _bounded_by_members(side, covering, reference):
                found.setdefault(side.framework, []).append(check)
    return found


NOT_REPRODUCIBLE = "not reproducible"  # how a check begins whose run gave other bits in a fresh process


def doubted_runs(checks: list[Check], reference: RunKey) -> list[RunKey]:
    """The float32 runs (not the reference's, nor a member) of the checks failing on rounding
    alone: each is run once more in a fresh process (harness/matrix.py reproduced) before its
    failure is called rounding."""
    failing = [c for c in checks if c.verdict == CheckVerdict.FAIL and (c.diagnosis or "").startswith(FLOAT32_ROUNDING)]
    return list(dict.fromkeys(k for c in failing for k in (c.a, c.b) if k.precision != FLOAT64 and not k.variant and k != reference))


def not_reproducible(checks: list[Check], apart: dict[RunKey, int]) -> list[Check]:
    """Each check failing on rounding alone whose float32 side gave other bits in a fresh
    process (`apart`: the run and the first step where two processes' losses differ): its
    diagnosis says so first, rounding being no explanation of a run that is not repeatable."""
    out = []
    for c in checks:
        side = next((k for k in (c.a, c.b) if k in apart), None)
        if side is not None and c.verdict == CheckVerdict.FAIL and (c.diagnosis or "").startswith(FLOAT32_ROUNDING):
            c = dataclasses.replace(c, diagnosis=f"{NOT_REPRODUCIBLE} ({side.label}: two processes differ from step {apart[side]}); {c.diagnosis}")
        out.append(c)
    return out


def math_doubted(checks: list[Check]) -> list[Check]:
    """The failing math-parity checks judged on a calibrated spread, over the twins' first
    steps or a re-anchored segment: those math parity's second look
    (harness/calibrate/calibration.py math_second_look) judges again on more float64
    members."""
    return [
        c
        for c in checks
        if c.verdict == CheckVerdict.FAIL
        and c.name.startswith(MATH)
        and c.a.precision == FLOAT64
        and c.bound is not None
        and c.bound.factor is not None
    ]


def diagnose(spec: Spec, checks: list[Check], reference: RunKey = ORACLE_KEY, placed: dict | None = None) -> list[Check]:
    """A diagnosis on every failing check (known ones keep theirs), with where it starts; each
    known check that library entries alone explain says so (library_known); a bf16 run's
    names what it computes in bfloat16 where torch's autocast keeps float32 (`placed`, bf16.apart)."""
    parity = _parity(checks)
    out = []
    for check in checks:
        if library_known(spec, check, reference):
            check = dataclasses.replace(check, library_known=True)
        if check.verdict in (CheckVerdict.FAIL, CheckVerdict.KNOWN):
            pair = [c for c in checks if {c.a, c.b} == {check.a, check.b}]
            if check.verdict == CheckVerdict.KNOWN:
                why = check.diagnosis
            elif (check.diagnosis or "").startswith(BEYOND):  # covered, and beyond what its entry explains
                why = f"{_diagnosis(check, parity, reference, placed)}; {check.diagnosis}"
            else:
                why = _diagnosis(check, parity, reference, placed)
            where = _where(check, pair, "the oracle" if reference.framework == ORACLE else reference.label)
            check = dataclasses.replace(check, diagnosis=f"{why}; {where}" if where else why)
        out.append(check)
    return out


def verdicts(spec: Spec, outcomes: dict, cal: Calibration) -> list[Check]:
    """Every check of a spec's matrix (rules.check_all), known differences applied, and a
    diagnosis on every failing or known check, led by a library defect a run measured
    (harness/verdict/defects.py)."""
    measured = check_all(spec, outcomes, cal)
    known = apply_known_differences(spec, measured, reach(spec, outcomes, cal), cal.reference, lying_with(spec, outcomes, cal))
    return defects.named(diagnose(spec, known, cal.reference, bf16.apart(outcomes)), outcomes, FLOAT32_ROUNDING)
