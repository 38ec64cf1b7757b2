"""The roles of calibration's jobs, and the jobs of each. Nothing runs here.

Who calibrates whom is a `Scheme`: the run every float32 run is measured against, the
float32 code whose reordered runs (members.reordered) are the envelope's members, and the
float64 code whose reordered runs over the first steps calibrate math parity and are the
float64 twins' reference. Today's workloads take `ORACLE_SCHEME`: the float64 oracle, the
array-module code in float32, the oracle again. Its roles:

- float32 members (whole runs), and, for each library with catalogued behaviours, float32
  members computing them (how far a known difference can carry that library's runs);
- with twins: the reference over the first steps, its float64 members, each framework's
  float64 twin, each library's formula computed by the reference with its own members,
  and, where the reference keeps states along the run, each of them again re-anchored.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, replace

from adapters.protocol import ComputesScheduleRates
from harness.core import registry
from harness.core.registry import (
    BF16,
    BF16_MEMBER_KEY,
    CALIBRATION_KEY,
    FLOAT32,
    FLOAT64,
    GPU_CALIBRATION_KEY,
    GPU_ORACLE_KEY,
    ORACLE,
    ORACLE_KEY,
    PORT_MEMBER_KEY,
    PORT_REFERENCE_KEY,
    RunKey,
)
from harness.execute import plan
from harness.execute.jobs import Job, cost
from harness.inputs.members import reordered
from harness.inputs.problem import Problem, truncated
from harness.run import anchored
from harness.spec import catalogue
from harness.spec.known import LibraryFormula
from harness.spec.load import LoadedSpec


@dataclass(frozen=True)
class Scheme:
    """Who calibrates whom (see the module's docstring)."""

    reference: RunKey  # the whole run the float32 runs and members are measured against
    member: RunKey  # the float32 code reordered into the envelope's members; its own run is one more
    reference64: RunKey  # the float64 code reordered into math parity's members; the twins' reference
    libraries: bool = True  # the float64 code can compute a library's catalogued formulas
    # ... those of their fields it can compute (harness/spec/known.py LibraryFormula), None: all
    computes: frozenset[str] | None = None


ORACLE_SCHEME = Scheme(reference=ORACLE_KEY, member=CALIBRATION_KEY, reference64=ORACLE_KEY)
# The same on the GPU (`harness run --references gpu`): the oracle, its members and the
# float32 calibration run are the array-module code on CuPy, in float64 and float32; where
# the CPU's oracle and members would take longer than the GPU runs they judge.
GPU_ORACLE_SCHEME = Scheme(reference=GPU_ORACLE_KEY, member=GPU_CALIBRATION_KEY, reference64=GPU_ORACLE_KEY)
# A user's port (model.python): no array-module code, so no oracle. torch's float64 run is
# the reference and the twins' reference, torch's float32 and float64 runs with the
# examples of each batch permuted (members.reordered: a port has no units the harness may
# move, nor roundings it may jitter) the members. Of the libraries' formulas, torch computes
# the variance a batch norm stores, its batch variance and a layer norm's variance as
# E[x^2] - E[x]^2 (adapters/torch_port.py), SGD's dampening (torch.optim's
# own), a schedule's rates and Adam's float32 bias corrections, and the clipping of another
# eps (adapters/torch_adapter.py _as_library and _clip); an entry that needs another explains
# nothing on a port (no members computing it run).
PORT_COMPUTES = frozenset({"running_var", "variance", "layer_norm_variance", "dampening", "rates", "bias_corrections", "clip_eps"})
PORT_SCHEME = Scheme(reference=PORT_REFERENCE_KEY, member=PORT_MEMBER_KEY, reference64=PORT_REFERENCE_KEY, computes=PORT_COMPUTES)


def scheme_of(problem: Problem) -> Scheme:
    """Who calibrates whom on a problem: the oracle's scheme (on the CPU or the GPU), or a port's."""
    if problem.port is not None:
        return PORT_SCHEME
    return ORACLE_SCHEME if problem.references == "cpu" else GPU_ORACLE_SCHEME


# The members a verdict runs first, of each kind (issue 54). A tolerance is
# factor * spread + floor, the spread the largest distance of any member from the
# reference: a check that passes on the first members' spread passes on more members'.
# The rest of the spec's members (long_run.members, math_parity.members) run only where a
# check calibrated on them does not pass (calibration.top_up), and the verdicts are then
# those of all of them: the same verdict in every case, with fewer members where every
# check passes (docs/measurements.md, the first look).
#
# Before the first look, the zeroth (issue 54): no member at all. The envelope's spread is
# then that of the scheme's own float32 run alone (numpy@cpu, a port's torch@cpu: a run the
# matrix trains anyway, and always the envelope's first), and math parity's is 0, every
# tolerance its rounding floor. By the same argument a check that passes there passes on any
# members', so the first look's members of a kind run only where a check they calibrate does
# not pass on the zeroth (calibration.first_look), and from there every look is as before:
# the same verdicts, with no member where every check passes on the floor.
FIRST_LOOK = 1
ALL, ZEROTH, FIRST, REST = "all", "zeroth", "first", "rest"  # which of the spec's members (member_seeds)

# The roles of calibration's jobs, in the order the tables name them.
MEMBER = "calibration member"  # float32, whole run
BF16_MEMBER = "bf16 member"  # torch's autocast run, whole run (bf16_jobs)
REFERENCE = "math parity's reference"  # the reference over the twins' first steps
MEMBER64 = "math parity's member"  # float64, first steps
TWIN = "float64 twin"
ANCHORED_MEMBER = "re-anchored member"
ANCHORED_TWIN = "re-anchored twin"
LIBRARY = "library reference"  # the reference computing a library's formula
LIBRARY_ANCHORED = "library reference, re-anchored"
# the reference's reordered members computing a library's formula: the spread of that
# formula's own dynamics, which calibrates the twin judged against it (first steps, and re-anchored)
LIBRARY_MEMBER = "library member"
LIBRARY_ANCHORED_MEMBER = "library member, re-anchored"
# the float32 members computing a library's catalogued behaviours: how far a known
# difference can carry that framework's float32 runs (harness/verdict/diagnosis.py reach)
LIBRARY32 = "library float32 member"
# the reference computing a library's formula over the whole run, in float64: where a float32
# check fails beyond what that library's float32 members reach, whether the run lies where
# the library's formula carries it (harness/calibrate/calibration.py library_whole)
LIBRARY_WHOLE = "library reference, whole run"


def _job(role: str, key: RunKey, label: str, **fields) -> Job:
    """One run as a job named by its key; only the twins' runs are recorded (Job.recorded),
    and none is timed (it may run in a kept process, Job.kept_group)."""
    return Job(key.label, role, ((key, label),), recorded=role in (TWIN, ANCHORED_TWIN), own_process=False, **fields)


def member_jobs(loaded: LoadedSpec, problem: Problem, seeds: list[tuple[RunKey, int]]) -> list[Job]:
    """The envelope's float32 members (whole runs), one job each."""
    found = []
    for key, seed in seeds:
        label = f"{loaded.name} {key.label} (calibration: its sums in another order)"
        found.append(_job(MEMBER, key, label, member=seed, cost=problem.total_steps))
    return found


def bf16_jobs(loaded: LoadedSpec, problem: Problem, keys: list[RunKey], scheme: Scheme) -> list[Job]:
    """Where a bf16 run is asked for, the bf16 envelope's members: torch's autocast run
    (BF16_MEMBER_KEY) with its sums in other orders, as many as the float32 envelope's
    (long_run.members), whole runs; with a JAX bf16 run on the CPU, as many again rounding
    where JAX rounds there too (`~xla-orderN`: each bias's gradient summed in bfloat16 by
    XLA:CPU, adapters/torch_bf16.py). Their distance from the reference is how far bf16
    rounding carries the run; every bf16 run is judged on it."""
    if not any(k.precision == BF16 for k in keys):
        return []
    found = []
    for key, seed in member_seeds(problem, FLOAT32, scheme=scheme):
        mk = replace(BF16_MEMBER_KEY, variant=key.variant)
        label = f"{loaded.name} {mk.label} (calibration: bf16, its sums in another order)"
        found.append(_job(BF16_MEMBER, mk, label, member=seed, cost=problem.total_steps))
        if RunKey("jax", "cpu", precision=BF16) in keys:  # ... and as many rounding where JAX rounds on the CPU
            xk = replace(BF16_MEMBER_KEY, variant=f"xla-{key.variant}")
            label = f"{loaded.name} {xk.label} (calibration: bf16, its sums in another order, rounding as flax and XLA:CPU round)"
            found.append(_job(BF16_MEMBER, xk, label, member=seed, cost=problem.total_steps, xla_bf16_sums=True))
    return found


def library32_jobs(loaded: LoadedSpec, problem: Problem, keys: list[RunKey], scheme: Scheme, part: str = ALL) -> list[Job]:
    """For each framework whose library has catalogued behaviours on this spec
    (harness/known_differences.yaml), float32 members computing them: the member code,
    reordered as the envelope's members are (those of `part`, member_seeds), whole runs.
    How far they get from the reference is how far those entries can explain a check
    (diagnosis.reach)."""
    found = []
    ours = (scheme.reference.framework, scheme.member.framework)
    runs: dict[str, RunKey] = {}  # each framework's first float32 run, in the keys' order
    for k in keys:
        if k.framework not in ours and k.precision != FLOAT64:
            runs.setdefault(k.framework, k)
    for framework, run in runs.items():
        behaviour = catalogue.library_behaviour(problem.spec, framework, keys)
        behaviour = computable(resolved(standing_for(problem.spec, run, behaviour, scheme), problem), scheme)
        if behaviour is None:
            continue
        for key, seed in member_seeds(problem, FLOAT32, scheme=scheme, part=part):
            mk = RunKey(key.framework, key.device, f"as-{framework}-{key.variant}")  # library32_framework reads it back
            label = f"{loaded.name} {mk.label} (calibration: {framework}'s catalogued behaviour, its sums in another order)"
            found.append(_job(LIBRARY32, mk, label, member=seed, formula=behaviour, cost=problem.total_steps))
    return found


def library32_framework(key: RunKey) -> str:
    """The framework whose catalogued behaviour a library float32 member computes, from its
    key as library32_jobs names it (numpy@cpu~as-<framework>-order<i>)."""
    return key.variant.removeprefix("as-").rsplit("-", 1)[0]


def twin_jobs(loaded: LoadedSpec, problem: Problem, keys: list[RunKey], scheme: Scheme, part: str = ALL) -> list[Job]:
    """Math parity's jobs: its reference, members and twins over the first steps, and where
    the whole reference runs with anchors, re-anchored along the run from its states; the
    float64 members (of every kind) those of `part` (member_seeds)."""
    name, first_steps = loaded.name, twin_problem(problem).total_steps
    ref64 = scheme.reference64
    first = replace(ref64, variant=f"first{first_steps}")
    label = f"{name} {first.label} (math parity's reference)"
    # read from the reference's whole run where it is in the matrix (it keeps its state at
    # the twins' last step: runner.first_steps), and run on its own only where that run did not
    reads = ref64 if ref64 in keys else None
    found = [_job(REFERENCE, first, label, steps=first_steps, cost=cost(first, first_steps), metrics=False, reads=reads)]
    seeds = member_seeds(problem, FLOAT64, scheme=scheme, part=part)
    found += _member64_jobs(name, seeds, first_steps, "math parity's calibration")
    states = (scheme.reference.label,) if scheme.reference in keys and problem.anchors else None
    anchored_cost = _segments_cost(problem, scheme)
    if states:
        found += _anchored_members(name, seeds, states, anchored_cost, "re-anchored math parity's calibration")
    for key in [t for t in plan.twin_keys(keys) if t.framework != ref64.framework]:
        # a twin that is the reference's own code (NumPy's float64 run is the oracle's) is read
        # from the reference's whole run, which kept its first steps and segment ends
        whole = ref64 if ref64 in keys and same_code(key, ref64) else None
        label = f"{name} {key.label} (float64 twin, first {first_steps} steps)"
        found.append(_job(TWIN, key, label, steps=first_steps, cost=cost(key, first_steps), reads=whole))
        if states:
            at = anchored.anchored_key(key)
            label = f"{name} {at.label} (float64 twin, re-anchored)"
            found.append(_job(ANCHORED_TWIN, at, label, needs=states, cost=anchored_cost, reads=whole))
        formula = _computed_formula(problem, key, scheme)
        ref = library_reference(key, scheme)
        if formula is None or any(c.name == ref.label for c in found):  # one per framework, whatever its devices
            continue
        computing = f"the {'oracle' if scheme is ORACLE_SCHEME else 'reference'} with {key.framework}'s formula"
        label = f"{name} {ref.label} ({computing})"
        found.append(_job(LIBRARY, ref, label, steps=first_steps, formula=formula, cost=cost(ref, first_steps), metrics=False))
        # that formula's own rounding spread: the reference's members computing it
        library_members = _library_members(ref64, ref, seeds)
        found += _library_member_jobs(name, key.framework, library_members, formula, first_steps)
        if states:
            at = anchored.anchored_key(ref)
            label = f"{name} {at.label} ({computing}, re-anchored)"
            found.append(_job(LIBRARY_ANCHORED, at, label, formula=formula, needs=states, cost=anchored_cost))
            why = f"re-anchored math parity's calibration, {key.framework}'s formula"
            found += _anchored_members(name, library_members, states, anchored_cost, why, formula)
    return found


def same_code(twin: RunKey, reference: RunKey) -> bool:
    """Whether `twin` runs the reference's own code: the same adapter on the same device in
    float64, eager (NumPy's float64 twin is the oracle: harness.reference.network bound to
    NumPy in float64, plain steps bitwise the eager ones, tests/test_fast_xp.py). Its runs
    are the reference's, bit for bit (tests/test_first_look.py), so they are read from it."""
    same = (twin.adapter, twin.device, twin.dtype, twin.mode, twin.variant)
    return same == (reference.adapter, reference.device, reference.dtype, reference.mode, reference.variant)


FLOAT64_MEMBERS = (MEMBER64, ANCHORED_MEMBER, LIBRARY_MEMBER, LIBRARY_ANCHORED_MEMBER)  # math parity's members, of every kind


# A float64 member's kind: its role and the start of its key's variant ("" for the reference's
# own members, "as-<framework>-" for those computing that library's formula). Each kind makes
# one spread (calibration.gather), and each twin's check reads one of them: over the first
# steps or re-anchored, the reference's own or its library's (Calibration.spread_of,
# segments_of). So a kind's members run only where one of its own checks needs them.
Kind = tuple[str, str]


def twin_kind(twin: RunKey, anchored_check: bool, library: bool, scheme: Scheme) -> Kind:
    """The kind of float64 member whose spread calibrates a check of `twin`: re-anchored with
    `anchored_check`, computing its library's formula where the twin is judged against one
    (`library`: that library's reference is planned)."""
    if library:
        return (LIBRARY_ANCHORED_MEMBER if anchored_check else LIBRARY_MEMBER), f"{library_reference(twin, scheme).variant}-"
    return (ANCHORED_MEMBER if anchored_check else MEMBER64), ""


def of_kinds(job: Job, kinds: Collection[Kind] | None) -> bool:
    """Whether `job` is a float64 member of one of `kinds` (None: of any kind)."""
    if job.role not in FLOAT64_MEMBERS:
        return False
    return kinds is None or any(job.role == role and all(k.variant.startswith(start) for k in job.keys) for role, start in kinds)


def look_jobs(
    loaded: LoadedSpec,
    problem: Problem,
    keys: list[RunKey],
    scheme: Scheme,
    part: str,
    float32: bool,
    float64: bool,
    kinds: Collection[Kind] | None = None,
) -> list[Job]:
    """The members of one look (`part`, member_seeds): the envelope's float32 members with
    `float32`, math parity's float64 members with `float64` (with twins), of `kinds` (None:
    of every kind)."""
    found = member_jobs(loaded, problem, member_seeds(problem, FLOAT32, scheme=scheme, part=part)) if float32 else []
    if float64:
        found += [j for j in twin_jobs(loaded, problem, keys, scheme, part=part) if of_kinds(j, kinds)]
    return found


def rest_jobs(
    loaded: LoadedSpec, problem: Problem, keys: list[RunKey], scheme: Scheme, float32: bool, float64: bool, kinds: Collection[Kind] | None = None
) -> list[Job]:
    """The members after the first look's (FIRST_LOOK), of the kinds asked for (look_jobs);
    with the first look's, the jobs calibration.jobs plans with every member."""
    return look_jobs(loaded, problem, keys, scheme, REST, float32, float64, kinds)


def _segments_cost(problem: Problem, scheme: Scheme) -> float:
    """What one run re-anchored along the whole run costs: the reference's steps over every segment."""
    return cost(scheme.reference, problem.spec.checks.math_parity.steps * len(problem.anchors))


def _anchored_members(name: str, members: list[tuple[RunKey, int]], states: tuple[str, ...], at_cost: float, why: str, formula=None) -> list[Job]:
    """Float64 members re-anchored along the run from the reference's `states`, one job
    each; computing a library's `formula` where one is given."""
    role = ANCHORED_MEMBER if formula is None else LIBRARY_ANCHORED_MEMBER
    keys = [(anchored.anchored_key(key), seed) for key, seed in members]
    return [_job(role, at, f"{name} {at.label} ({why})", member=seed, formula=formula, needs=states, cost=at_cost) for at, seed in keys]


def _member64_jobs(name: str, seeds: list[tuple[RunKey, int]], first_steps: int, why: str) -> list[Job]:
    """Math parity's float64 members over the twins' first steps, one job each."""
    return [
        _job(MEMBER64, key, f"{name} {key.label} ({why})", steps=first_steps, member=seed, cost=cost(key, first_steps), metrics=False)
        for key, seed in seeds
    ]


def _computed_formula(problem: Problem, twin: RunKey, scheme: Scheme):
    """The library formula the scheme's reference computes for `twin`, resolved; None where
    it computes none."""
    return computable(resolved(twin_formula(problem.spec, twin, scheme), problem), scheme) if scheme.libraries else None


def _library_members(ref64: RunKey, ref: RunKey, seeds: list[tuple[RunKey, int]]) -> list[tuple[RunKey, int]]:
    """The keys and seeds of the reference's members computing the library formula of `ref`."""
    return [(replace(ref64, variant=f"{ref.variant}-{k.variant}"), seed) for k, seed in seeds]


def _library_member_jobs(name: str, framework: str, members: list[tuple[RunKey, int]], formula, first_steps: int) -> list[Job]:
    found = []
    for mk, seed in members:
        label = f"{name} {mk.label} (math parity's calibration, {framework}'s formula)"
        found.append(_job(LIBRARY_MEMBER, mk, label, steps=first_steps, member=seed, formula=formula, cost=cost(mk, first_steps), metrics=False))
    return found


def library_whole_jobs(loaded: LoadedSpec, problem: Problem, runs: list[RunKey], scheme: Scheme) -> list[Job]:
    """The reference computing the formula of each library among `runs` (float32 runs) that
    has one, over the whole run, in float64: one job per framework."""
    found = []
    for framework in dict.fromkeys(r.framework for r in runs if r.framework != scheme.reference64.framework):
        key = replace(next(r for r in runs if r.framework == framework), precision=FLOAT64)
        formula = _computed_formula(problem, key, scheme)
        if formula is None:
            continue
        whole = replace(library_reference(key, scheme), variant=f"as-{framework}-whole")
        computing = f"the {'oracle' if scheme is ORACLE_SCHEME else 'reference'} with {framework}'s formula, the whole run"
        found.append(_job(LIBRARY_WHOLE, whole, f"{loaded.name} {whole.label} ({computing})", formula=formula, cost=cost(whole, problem.total_steps)))
    return found


def math_second_look_jobs(loaded: LoadedSpec, problem: Problem, twins: list[RunKey], scheme: Scheme, upto: int, segments: bool = False) -> list[Job]:
    """Math parity's second look (harness/calibrate/calibration.py math_second_look): the
    float64 members after the first look's, up to `upto` in all, over the twins' first
    steps, and as many of the reference's members computing the formula of each library
    among `twins` that has one; with `segments` (a re-anchored segment doubted), the same
    members re-anchored along the run too, from the reference's states."""
    name, first_steps = loaded.name, twin_problem(problem).total_steps
    seeds = member_seeds(problem, FLOAT64, upto=upto, scheme=scheme)
    states = (scheme.reference.label,) if segments and problem.anchors else None
    found = _member64_jobs(name, seeds, first_steps, "math parity's calibration, second look")
    if states:
        found += _anchored_members(name, seeds, states, _segments_cost(problem, scheme), "re-anchored math parity's calibration, second look")
    for framework in dict.fromkeys(t.framework for t in twins if t.framework != scheme.reference64.framework):
        key = next(t for t in twins if t.framework == framework)
        formula = _computed_formula(problem, key, scheme)
        if formula is not None:
            members = _library_members(scheme.reference64, library_reference(key, scheme), seeds)
            found += _library_member_jobs(name, framework, members, formula, first_steps)
            if states:
                why = f"re-anchored math parity's calibration, {framework}'s formula, second look"
                found += _anchored_members(name, members, states, _segments_cost(problem, scheme), why, formula)
    return found


def twin_formula(spec, twin: RunKey, scheme: Scheme) -> LibraryFormula | None:
    """The library formula the reference computes for `twin` (catalogue.library_formula, as
    standing_for says)."""
    return standing_for(spec, twin, catalogue.library_formula(spec, twin), scheme)


def standing_for(spec, run: RunKey, formula: LibraryFormula | None, scheme: Scheme) -> LibraryFormula | None:
    """`formula`, what `run`'s library computes, as the scheme's code computes it to stand for
    that library. On a port the reference and its members are torch's own code, which
    computes torch's catalogued formulas: where torch's clipping differs from the spec (its
    eps) and `run`'s library's does not, they clip as the spec does (eps 0), so that a twin
    is judged on its own library's math, not torch's, and the float32 members computing its
    library's behaviour (library32_jobs) reach as far as that library's runs are carried from
    torch's reference."""
    if scheme.reference.framework == ORACLE or run.framework == scheme.reference.framework:
        return formula
    own = catalogue.library_formula(spec, replace(run, framework=scheme.reference.framework))
    if own is None or own.clip_eps is None or (formula is not None and formula.clip_eps is not None):
        return formula
    return (formula or LibraryFormula()).model_copy(update={"clip_eps": 0.0})


def library_reference(twin: RunKey, scheme: Scheme = ORACLE_SCHEME) -> RunKey:
    """The key of the float64 reference computing `twin`'s library's formula (one per framework)."""
    return replace(scheme.reference64, variant=f"as-{twin.framework}")


def computable(formula, scheme: Scheme):
    """The part of a library's formula the scheme's code computes; None where that is nothing
    (the entry then explains nothing: no members computing it run)."""
    if formula is None or scheme.computes is None:
        return formula
    # a part it cannot compute: members computing the rest would not bound the whole
    return formula if set(formula.model_dump(exclude_none=True)) <= scheme.computes else None


def member_seeds(
    problem: Problem, dtype: str = FLOAT32, upto: int | None = None, scheme: Scheme = ORACLE_SCHEME, part: str = ALL
) -> list[tuple[RunKey, int]]:
    """The calibration members' keys and seeds: the scheme's code on the problem with its
    sums in another order (members.reordered), each with its own seed. float32: the
    envelope's members (long_run.members, whole runs); float64: math parity's
    (math_parity.members, over the twins' first steps). `part`: all of them, the zeroth
    look's (none), the first look's (FIRST_LOOK of them) or the rest. With `upto`, the
    members after all of them, up to that many in all (the envelope's second look)."""
    if dtype == FLOAT32:
        count, code = problem.spec.checks.long_run.members, scheme.member
    else:
        count, code = problem.spec.checks.math_parity.members, scheme.reference64
    first = min(count, FIRST_LOOK)
    if upto is not None:
        seeds = range(count + 1, upto + 1)
    else:
        seeds = {ALL: range(1, count + 1), ZEROTH: range(1, 1), FIRST: range(1, first + 1), REST: range(first + 1, count + 1)}[part]
    return [(replace(code, variant=f"order{i}"), i) for i in seeds]


def calibration_members(problem: Problem, dtype: str = FLOAT32, upto: int | None = None) -> list[tuple[RunKey, Problem]]:
    """The calibration members (member_seeds, `upto` as there), each with its problem."""
    return [(key, reordered(problem, seed=seed)) for key, seed in member_seeds(problem, dtype, upto)]


def resolved(formula, problem: Problem):
    """A library formula with what it names computed: `rates: optax` becomes the learning
    rate of every update of the run as optax's schedule gives it (adapters/jax_adapter.py
    schedule_rates, in this process, once per spec), a sequence of numbers the worker's
    oracle takes as they are. None stays None."""
    if formula is None or formula.rates is None or isinstance(formula.rates, tuple):
        return formula
    opt = problem.spec.optimizer
    if opt.schedule is None:
        return formula.model_copy(update={"rates": None})
    steps = problem.spec.training.epochs * len(problem.bounds)  # the whole run's, in a twin's problem too
    return formula.model_copy(update={"rates": _optax_rates(opt.model_dump_json(), type(opt), steps)})


@functools.cache
def _optax_rates(optimizer: str, kind: type, steps: int) -> tuple[float, ...]:
    """optax's rates for an optimizer section (as JSON, so that it keys the cache), computed
    once per process: the twins' reference and every library member of a spec take the same."""
    adapter = registry.load("jax")
    if not isinstance(adapter, ComputesScheduleRates):
        raise TypeError("the jax adapter computes no schedule rates (adapters/protocol.py ComputesScheduleRates)")
    return tuple(adapter.schedule_rates(kind.model_validate_json(optimizer), steps))


def twin_problem(problem: Problem) -> Problem:
    """The problem the float64 twins, the reference's first steps and math parity's members
    train: its first `twin_steps` steps."""
    return truncated(problem, problem.twin_steps)
