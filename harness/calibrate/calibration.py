"""The calibration stage in three calls:

- `jobs`: from a spec (loaded, problem) and the runs asked for (keys, twins), the jobs
  calibration needs (their roles and who calibrates whom: harness/calibrate/roles.py);
- `gather`: from the finished jobs, the spreads that set every tolerance (`Calibration`,
  measured in harness/calibrate/spread.py), with the members the terminal shows and the
  float64 twins the records hold (`Calibrated`);
- `library_look`: where a failing float32 check is covered by a library entry, the float32
  members computing that library's behaviour (how far the entry carries its runs), run
  only then;
- `second_look`: where float32 checks fail on rounding alone, the envelope measured again
  on more members.

Each takes a `Scheme` (roles.py): which run is the reference and whose reordered runs are
the members. Today's workloads take the oracle's. A workload with no float64 oracle (a
user's own torch or flax model) would pass its own: the reference its framework's float64
run, the float32 members and the float64 members that framework's own runs with the
examples of each batch permuted, `libraries=False` (no array-module code computes a
library's formula for it); its float64 twins are then judged against that reference, and
so against one another, and its float32 runs against the envelope of its own members.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from rich.console import Console

from harness.calibrate import roles
from harness.calibrate.roles import ORACLE_SCHEME, Scheme
from harness.calibrate.spread import Calibration, Segments, Spread, floor_segments, floor_spread, measure, measure_segments, measure_segments_against
from harness.core.registry import ANCHORED_CHECKS, BF16, BF16_MEMBER_KEY, FLOAT32, FLOAT64, CheckVerdict, RunKey
from harness.execute.hosts import is_copy
from harness.execute.jobs import Job
from harness.execute.plan import framework_jobs
from harness.inputs.problem import Problem
from harness.run.anchored import anchored_key
from harness.run.runner import Outcome
from harness.spec.load import LoadedSpec

Done = dict[str, dict[RunKey, Outcome]]  # each finished job's outcomes, by the job's name


@dataclass(frozen=True)
class Calibrated:
    """What calibration hands on: the spreads, the members the terminal's table shows (they
    calibrate the checks and are not written), and the float64 twins, recorded as runs."""

    calibration: Calibration
    members: list[Outcome]  # the float32 members, in plain unit order
    members64: list[Outcome]  # the float64 members over the first steps
    twins: dict[RunKey, Outcome]  # each float64 twin's outcome over the first steps


def jobs(
    loaded: LoadedSpec, problem: Problem, keys: list[RunKey], twins: bool, scheme: Scheme = ORACLE_SCHEME, part: str = roles.ZEROTH
) -> list[Job]:
    """Calibration's jobs for the runs `keys` of a spec: the float32 members; with `twins`,
    math parity's reference, members and twins over the first steps, the library references
    with their members, and the re-anchored members, twins and library references, which
    start from the reference's states. No member of any kind runs at first (the zeroth look,
    roles.ZEROTH): the first look's run where a check they calibrate needs them (first_look),
    the rest where one still does (top_up), unless `part` says which. The library float32
    members run only where a check needs them (library_look)."""
    found = roles.member_jobs(loaded, problem, roles.member_seeds(problem, FLOAT32, scheme=scheme, part=part))
    return found + roles.twin_jobs(loaded, problem, keys, scheme, part) if twins else found


def matrix_jobs(loaded: LoadedSpec, problem: Problem, keys: list[RunKey], repeats: int | None, twins: bool) -> list[Job]:
    """The spec's matrix as jobs (harness/execute/jobs.py): the chosen runs, their modes
    together (harness/execute/plan.py), and the jobs calibration needs (`jobs`)."""
    scheme = roles.scheme_of(problem)
    calibrating = jobs(loaded, problem, keys, twins, scheme) + roles.bf16_jobs(loaded, problem, keys, scheme)
    # a twin of the reference's own code reads its metrics at the twins' last step too
    read = {c.reads.label for c in calibrating if c.reads is not None and c.role == roles.TWIN}
    framework = [replace(c, first_metrics=True) if c.name in read else c for c in framework_jobs(loaded, problem, keys, repeats)]
    return [*framework, *calibrating]


class Judged(Protocol):
    """A check, as first_look and top_up read it (harness/verdict/checks.py Check)."""

    name: str
    a: RunKey
    b: RunKey
    verdict: CheckVerdict
    ratio: float | None


def first_look(
    loaded: LoadedSpec,
    problem: Problem,
    keys: list[RunKey],
    planned: list[Job],
    done: Done,
    runs: dict[RunKey, Outcome],
    checks: list[Judged],
    run: Callable[..., Done],
    console: Console,
    scheme: Scheme = ORACLE_SCHEME,
) -> tuple[list[Job], Done, Calibrated] | None:
    """The first look after the zeroth (roles.ZEROTH: no member of any kind): the first of the
    spec's members of each kind where a check they calibrate does not pass (fails, or is
    known) on the zeroth's spread, run by `run` (the re-anchored ones from the reference's
    states), and everything gathered again: the float32 members where a float32 check does not
    pass on the scheme's own float32 run alone, math parity's float64 members of each kind
    (roles.Kind) whose spread a twin's check that does not pass on its rounding floor alone
    reads (_kinds). A tolerance grows with the spread, so a check that passes on the zeroth
    passes on the first look's members; each check reads one spread, so a kind none of whose
    checks stands keeps its floor. The verdicts are the first look's; from here every later
    look is as before (a check known on the zeroth look is judged on the first look's
    members too, as the library entries' rule was measured: diagnosis.library_known). None
    where every check passes or is skipped, or the members are planned already
    (calibration.jobs with every member)."""
    standing, float32, kinds = _needing(checks, planned, scheme)
    float32, kinds = float32 and not _ran(planned, (roles.MEMBER,)), {k for k in kinds if not _ran_kind(planned, k)}
    again = roles.look_jobs(loaded, problem, keys, scheme, roles.FIRST, float32, bool(kinds), kinds)
    if not again:
        return None
    worst = max(standing, key=lambda c: c.ratio or 0)
    kinds = " and ".join(k for k, on in (("float32", float32), ("float64", kinds)) if on)
    console.print(
        f"  {loaded.name}: {len(standing)} checks do not pass on the zeroth look (no member; {worst.a.label} vs {worst.b.label}: "
        f"{worst.name}); running the first look's {len(again)} {kinds} member{'s' if len(again) > 1 else ''}"
    )
    planned, done = [*planned, *again], {**done, **run(again, done)}  # the re-anchored ones start from the reference's states
    return planned, done, gather(planned, done, runs, scheme)


def _needing(checks: list[Judged], planned: list[Job], scheme: Scheme) -> tuple[list[Judged], bool, set[roles.Kind]]:
    """The checks that do not pass (fail, or are known) and whether more members could judge
    them otherwise: float32 members for a float32 pair's check, and, where twins run, the
    kinds of float64 member whose spreads a twin's checks read (a pair's `a` is never the
    reference)."""
    standing = [c for c in checks if c.verdict not in (CheckVerdict.PASS, CheckVerdict.SKIPPED)]
    float32 = any(c.a.precision != FLOAT64 for c in standing)
    return standing, float32, _kinds([c for c in standing if c.a.precision == FLOAT64], planned, scheme) if _ran(planned, (roles.TWIN,)) else set()


def _kinds(twins_checks: list[Judged], planned: list[Job], scheme: Scheme) -> set[roles.Kind]:
    """The kinds of float64 member (roles.Kind) whose spreads these checks of float64 twins
    read: a re-anchored check's (math_anchored_*) the re-anchored members', any other the
    members' over the first steps; those computing the twin's library formula where its
    library reference is planned (the twin is judged against it), else the reference's own."""
    libraries = {c.name for c in planned if c.role == roles.LIBRARY}
    return {
        roles.twin_kind(c.a, c.name.startswith(ANCHORED_CHECKS), roles.library_reference(c.a, scheme).label in libraries, scheme)
        for c in twins_checks
    }


def _ran(planned: list[Job], roles_of: tuple[str, ...]) -> bool:
    """Whether a job of one of these roles is planned (it runs, or ran)."""
    return any(c.role in roles_of for c in planned)


def _ran_kind(planned: list[Job], kind: roles.Kind) -> bool:
    """Whether a float64 member of this kind is planned (it runs, or ran)."""
    return any(roles.of_kinds(c, (kind,)) for c in planned)


def top_up(
    loaded: LoadedSpec,
    problem: Problem,
    keys: list[RunKey],
    planned: list[Job],
    done: Done,
    runs: dict[RunKey, Outcome],
    checks: list[Judged],
    run: Callable[..., Done],
    console: Console,
    scheme: Scheme = ORACLE_SCHEME,
) -> tuple[list[Job], Done, Calibrated] | None:
    """The rest of the spec's members (roles.rest_jobs) where a check calibrated on the first
    look's does not pass: the float32 members where a float32 pair's check fails or is
    known, math parity's float64 members of each kind whose spread a standing twin's check
    reads (_kinds), run by `run` (the re-anchored ones from the reference's states), and
    everything gathered again from both looks' jobs. A tolerance grows with the spread, the
    largest distance of any member: a check that passes on the first look's members passes
    on all of them, so the verdicts are those of every member from the start. `checks` are
    those more members may judge otherwise: harness/matrix.py leaves out a float32 check its
    library entries explain on the first look's (diagnosis.library_known), which more could
    make pass (of 101 measured, none failed). It follows first_look, which ran the first look's members of
    every kind a check here needs (a check that passed on the zeroth look passes on any
    members'). None where every check passes."""
    standing, float32, kinds = _needing(checks, planned, scheme)
    again = roles.rest_jobs(loaded, problem, keys, scheme, float32, bool(kinds), kinds)
    if not again:
        return None
    kinds = " and ".join(k for k, on in (("float32", float32), ("float64", kinds)) if on)
    console.print(
        f"  {loaded.name}: {len(standing)} checks do not pass on the first look's members; "
        f"running the {len(again)} other {kinds} members the spec asks for"
    )
    planned, done = [*planned, *again], {**done, **run(again, done)}  # the re-anchored ones start from the reference's states
    return planned, done, gather(planned, done, runs, scheme)


def gather(planned: list[Job], done: Done, runs: dict[RunKey, Outcome], scheme: Scheme = ORACLE_SCHEME) -> Calibrated:
    """The calibration from the finished jobs: `planned` (those of `jobs` among them) and their
    outcomes `done`, with `runs`, the outcomes of the runs asked for (the scheme's reference
    and member run among them). A spread whose runs did not all finish is None."""

    def outcomes(role: str, variant: str = "") -> list[Outcome]:
        return [o for c in planned if c.role == role and not is_copy(c) for o in done.get(c.name, {}).values() if o.key.variant.startswith(variant)]

    float32 = outcomes(roles.MEMBER)
    twins = {o.key: o for o in outcomes(roles.TWIN)}
    reference = next(iter(outcomes(roles.REFERENCE)), None)
    float64 = outcomes(roles.MEMBER64)
    found = outcomes(roles.ANCHORED_MEMBER)

    def zeroth(kind: roles.Kind) -> bool:  # math parity's zeroth look (roles.ZEROTH) of a kind: none of its members planned, its spread 0
        return not _ran_kind(planned, kind)

    library, library_spread = {}, {}
    for key in twins:
        ref = roles.library_reference(key, scheme)
        first = done.get(ref.label, {}).get(ref)
        if first is None:
            continue
        again = done.get(anchored_key(ref).label, {}).get(anchored_key(ref))
        library[key.framework, key.device] = (first, again)
        theirs = f"{ref.variant}-"  # the members computing that library's formula (jobs)
        again_members = outcomes(roles.LIBRARY_ANCHORED_MEMBER, theirs)
        segments_of = None
        if again is not None and again.status == "ok":
            segments_of = (
                floor_segments(again.segments, again.segment_ends, again.segment_outputs)
                if zeroth((roles.LIBRARY_ANCHORED_MEMBER, theirs))
                else measure_segments_against(again.segments, again_members, again.segment_ends, again.segment_outputs)
            )
        first_members = outcomes(roles.LIBRARY_MEMBER, theirs)
        first_spread = floor_spread(first, FLOAT64) if zeroth((roles.LIBRARY_MEMBER, theirs)) else measure(first, first_members, FLOAT64)
        library_spread[key.framework, key.device] = (first_spread, segments_of)
    library32: dict[str, list[Outcome]] = {}
    for o in outcomes(roles.LIBRARY32):  # numpy@cpu~as-<framework>-order<i>
        library32.setdefault(roles.library32_framework(o.key), []).append(o)
    anchored_twins = {(o.key.framework, o.key.device): o for o in outcomes(roles.ANCHORED_TWIN)}
    if zeroth((roles.ANCHORED_MEMBER, "")):
        segments = _floor_segments(runs.get(scheme.reference), anchored_twins.values())
    else:
        segments = measure_segments(runs.get(scheme.reference), found) if found else None
    calibration = Calibration(
        measure(runs.get(scheme.reference), [runs.get(scheme.member), *float32], FLOAT32),
        floor_spread(reference, FLOAT64) if zeroth((roles.MEMBER64, "")) else measure(reference, float64, FLOAT64),
        reference,
        segments,
        anchored_twins,
        library,
        library_spread,
        library32,
        scheme.reference,
        scheme.member,
        bf16=_bf16(runs, outcomes(roles.BF16_MEMBER), scheme),
    )
    return Calibrated(calibration, float32, float64, twins)


def _bf16(runs: dict[RunKey, Outcome], members: list[Outcome], scheme: Scheme) -> Spread | None:
    """The bf16 envelope: torch's autocast run and its members around the reference; None
    where none ran."""
    own = runs.get(BF16_MEMBER_KEY)
    return measure(runs.get(scheme.reference), [own, *members], BF16) if members and own is not None else None


def _floor_segments(reference: Outcome | None, twins) -> Segments | None:
    """The zeroth look's spread over the re-anchored segments of the whole run `reference`
    (spread.floor_segments): each segment as long as the re-anchored twins' (`twins`), which
    ran them from its states. None where it kept no states, or no twin ran a segment."""
    lengths = {a: len(losses) for t in twins if t.status == "ok" for a, losses in t.segments.items()}
    if reference is None or reference.status != "ok" or not reference.anchor_states or not lengths:
        return None
    starts = sorted(a for a in reference.anchor_states if a in lengths)
    return floor_segments({a: reference.losses[a : a + lengths[a]] for a in starts}, reference.segment_ends, reference.segment_outputs)


class Doubt(Protocol):
    """A float32 check that fails on rounding alone (harness/verdict/diagnosis.py on_rounding_alone)."""

    name: str
    a: RunKey
    b: RunKey
    ratio: float | None


def library_look(
    loaded: LoadedSpec,
    problem: Problem,
    keys: list[RunKey],
    planned: list[Job],
    done: Done,
    runs: dict[RunKey, Outcome],
    unmeasured: dict[str, list[Doubt]],
    run: Callable[[list[Job]], Done],
    console: Console,
    scheme: Scheme = ORACLE_SCHEME,
) -> tuple[list[Job], Done, Calibrated] | None:
    """The float32 members computing a library's catalogued behaviour (roles.library32_jobs)
    of each library in `unmeasured` (diagnosis.unmeasured_libraries: those a failing check
    covered by a library entry needs, none of them run), for its runs among those asked for
    (`keys`). They bound how far an entry explains a failing check (diagnosis.reach) and say
    nothing of a check that passes or that no library entry covers, so they run only here,
    by `run`, and everything is gathered again from both looks' jobs: the same verdicts as
    had they run with the rest from the start, at none of their cost on a run whose covered
    checks pass (issue 54). None where nothing needs them or no library has members
    computing its behaviour."""
    if not unmeasured or not scheme.libraries:
        return None
    again = roles.library32_jobs(loaded, problem, [k for k in keys if k.framework in unmeasured], scheme, roles.FIRST)
    if not again:
        return None
    doubted = list(dict.fromkeys(c for checks in unmeasured.values() for c in checks))
    worst = max(doubted, key=lambda c: c.ratio or 0)
    console.print(
        f"  {loaded.name}: {len(doubted)} float32 checks fail where a library entry covers them ({worst.a.label} vs {worst.b.label}: "
        f"{worst.name}, {worst.ratio:.3g}x); running {len(again)} members computing {', '.join(unmeasured)}'s catalogued behaviour"
    )
    planned, done = [*planned, *again], {**done, **run(again)}
    return planned, done, gather(planned, done, runs, scheme)


def library_top_up(
    loaded: LoadedSpec,
    problem: Problem,
    keys: list[RunKey],
    planned: list[Job],
    done: Done,
    runs: dict[RunKey, Outcome],
    beyond: list[Doubt],
    run: Callable[[list[Job]], Done],
    console: Console,
    scheme: Scheme = ORACLE_SCHEME,
) -> tuple[list[Job], Done, Calibrated] | None:
    """The rest of the float32 members computing a library's catalogued behaviour (after
    library_look's first look, roles.FIRST_LOOK) where a check fails beyond what its entries
    explain on the first look's (`beyond`, diagnosis.beyond_reach): an entry explains a check
    up to the largest distance any of its members reaches, so a check explained on the first
    look's members is explained on all of them, and one that is not is judged on all of them,
    as had they run from the start. None where nothing is beyond, or every member ran."""
    ran = [c for c in planned if c.role == roles.LIBRARY32]
    frameworks = {roles.library32_framework(key) for c in ran for key in c.keys}
    named = {c.name for c in ran}  # after the envelope's second look, the rest may have run already
    rest = roles.library32_jobs(loaded, problem, [k for k in keys if k.framework in frameworks], scheme, roles.REST)
    again = [j for j in rest if j.name not in named]
    if not beyond or not again:
        return None
    worst = max(beyond, key=lambda c: c.ratio or 0)
    console.print(
        f"  {loaded.name}: {len(beyond)} float32 checks fail beyond what the first look's members computing a library's behaviour reach "
        f"({worst.a.label} vs {worst.b.label}: {worst.name}, {worst.ratio:.3g}x); running the {len(again)} other members the spec asks for"
    )
    planned, done = [*planned, *again], {**done, **run(again)}
    return planned, done, gather(planned, done, runs, scheme)


def math_second_look(
    loaded: LoadedSpec,
    problem: Problem,
    planned: list[Job],
    done: Done,
    runs: dict[RunKey, Outcome],
    doubted: list[Doubt],
    run: Callable[..., Done],
    console: Console,
    scheme: Scheme = ORACLE_SCHEME,
) -> tuple[list[Job], Done, Calibrated] | None:
    """Math parity's second look before a float64 twin's failure stands (`doubted`: over its
    first steps or a re-anchored segment). Three float64 members undershoot the spread of
    an honest twin now and then: on a port, whose members are torch's own runs (a twin at
    1.44x of three members' spread came to 0.36x of twelve's, 2026-11-26), and against the
    oracle too (JAX's twins of two generated workloads of 200 never run before, at 1.2x and
    1.65x of three, came to 0.35x and 0.14x of sixteen; 158 of the 163 effective bugs of the
    same 200 were caught at 2.8e8x and more, the other 5 saying no ratio:
    docs/measurements.md, 2026-12-02). The members
    after the first look's, up to long_run.second_look in all (and as many computing each
    doubted twin's library formula; re-anchored along the run too where a segment is
    doubted), run by `run`, and everything gathered again from both looks' jobs: the
    planned jobs, their outcomes and the calibration; None where nothing is doubted. Only
    the kinds of member whose spreads the doubted checks read run (_kinds): no other kind's
    spread judges a failing check."""
    if not doubted:
        return None
    twins = list(dict.fromkeys(c.a for c in doubted))
    kinds = _kinds(doubted, planned, scheme)  # the kinds whose spreads the doubted checks read
    segments = any(c.name.startswith(ANCHORED_CHECKS) for c in doubted)  # a re-anchored segment's check: its members re-anchored too
    again = roles.math_second_look_jobs(loaded, problem, twins, scheme, problem.spec.checks.long_run.second_look, segments)
    again = [j for j in again if roles.of_kinds(j, kinds)]
    if not again:
        return None
    worst = max(doubted, key=lambda c: c.ratio or 0)
    console.print(
        f"  {loaded.name}: {len(doubted)} math-parity checks fail ({worst.a.label}: {worst.name}, {worst.ratio:.3g}x); "
        f"measuring the float64 spread again with {sum(c.role == roles.MEMBER64 for c in again)} more members"
        f"{' (re-anchored too)' if segments else ''}"
    )
    planned, done = [*planned, *again], {**done, **run(again, done)}  # the re-anchored ones start from the reference's states
    return planned, done, gather(planned, done, runs, scheme)


def second_look(
    loaded: LoadedSpec,
    problem: Problem,
    planned: list[Job],
    done: Done,
    found: Calibrated,
    runs: dict[RunKey, Outcome],
    doubted: list[Doubt],
    run: Callable[[list[Job]], Done],
    console: Console,
    scheme: Scheme = ORACLE_SCHEME,
) -> tuple[list[Job], Done, Calibrated] | None:
    """The envelope's second look before a rounding failure stands (`doubted`): the members
    after the first look's, up to long_run.second_look in all, run by `run` (the driver's,
    harness/execute/schedule.py), and the float32 spread measured again on all of them; the
    jobs planned and done with its own among them, as the other looks return them (a later
    look gathers them again). None where nothing is doubted, there is nothing to look at
    again (no more members, no first spread) or a new member failed: the first look's
    verdicts stand, and its jobs are not kept."""
    more = roles.member_seeds(problem, FLOAT32, upto=problem.spec.checks.long_run.second_look, scheme=scheme)
    if not doubted or not more or found.calibration.float32 is None:
        return None
    worst = max(doubted, key=lambda c: c.ratio or 0)
    console.print(
        f"  {loaded.name}: {len(doubted)} float32 checks fail on rounding alone ({worst.a.label} vs {worst.b.label}: "
        f"{worst.name}, {worst.ratio:.3g}x); measuring the envelope again with {len(more)} more members"
    )
    again = roles.member_jobs(loaded, problem, more)
    finished = run(again)
    extra = [o for c in again if not is_copy(c) for o in finished.get(c.name, {}).values()]
    members32 = [*found.members, *extra]
    wider = measure(runs.get(scheme.reference), [runs.get(scheme.member), *members32], FLOAT32)
    if wider is None:
        return None
    return [*planned, *again], {**done, **finished}, replace(found, calibration=replace(found.calibration, float32=wider), members=members32)


def library_whole(
    loaded: LoadedSpec,
    problem: Problem,
    found: Calibrated,
    doubted: list[Doubt],
    run: Callable[[list[Job]], Done],
    console: Console,
    scheme: Scheme = ORACLE_SCHEME,
) -> Calibrated | None:
    """A last look before a float32 check fails beyond what a library's entry explains
    (`doubted`, diagnosis.beyond_entries): the reference computing that library's formula over
    the whole run, in float64 (roles.library_whole_jobs), run by `run`. Its float32 members
    bound how far the entry carries a run by where their own rounding takes them; a run
    whose dynamics tip one way on a difference the formula makes (the clipping's eps at step
    97 of a port, docs/measurements.md) lies where the formula itself lies, which only this
    run shows. None where no doubted run's library has a formula the reference computes."""
    runs = [k for c in doubted for k in (c.a, c.b) if k.precision != FLOAT64 and k.framework != scheme.reference.framework]
    again = roles.library_whole_jobs(loaded, problem, runs, scheme)
    if not again:
        return None
    worst = max(doubted, key=lambda c: c.ratio or 0)
    console.print(
        f"  {loaded.name}: {len(doubted)} float32 checks fail beyond what their library entries' members reach "
        f"({worst.a.label} vs {worst.b.label}: {worst.name}, {worst.ratio:.3g}x); running {', '.join(j.name for j in again)}"
    )
    done = run(again)
    wholes = {o.key.variant.removeprefix("as-").removesuffix("-whole"): o for c in again for o in done.get(c.name, {}).values()}
    return replace(found, calibration=replace(found.calibration, library_whole=wholes))
