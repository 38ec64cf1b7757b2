"""The zeroth and the first look (harness/calibrate/roles.py ZEROTH and FIRST_LOOK,
calibration.first_look and top_up): a verdict runs no member at first, the first of the
spec's members of a kind where a check they calibrate does not pass on the zeroth look's
spread (the plain float32 run alone; math parity's floor), and the rest only where a check
still does not pass; its verdicts are those of every member from the start."""

from __future__ import annotations

import io
import re
from collections import Counter

import pytest
from rich.console import Console

from harness import matrix
from harness.calibrate import calibration, roles
from harness.core.paths import PROJECT_ROOT, SPECS_DIR
from harness.core.registry import CALIBRATION_KEY, FLOAT64, ORACLE_KEY, CheckVerdict, RunKey
from harness.execute import plan
from harness.inputs.problem import build_problem, truncated
from harness.spec.load import load_spec
from harness.verdict import checks, diagnosis
from tests.conftest import quick_problem
from tests.test_checks import short_quick

TWIN = RunKey("jax", "cpu", precision=FLOAT64)
JAX = RunKey("jax", "cpu")


@pytest.mark.parametrize(
    "name, kinds",
    [
        ("moons_net", {roles.MEMBER64, roles.ANCHORED_MEMBER}),  # one float32 member: all of them in the first look
        ("gpl_transformer", {roles.MEMBER, roles.MEMBER64, roles.LIBRARY_MEMBER}),  # its JAX twin judged against optax's formula
    ],
)
def test_the_first_look_and_the_rest_are_every_member_the_spec_asks_for(name, kinds):
    """moons_net re-anchors its twins along the run; gpl_transformer's JAX twin is judged against
    optax's formula, with members computing it: every kind of member, split in three (none on
    the zeroth look)."""
    loaded, problem = load_spec(SPECS_DIR / f"{name}.yaml", "quick"), quick_problem(name)  # nothing runs: the quick profile's whole plan
    keys = plan.matrix_keys(["torch", "jax", "numpy"], ["cpu"])
    every = Counter(j.name for j in calibration.jobs(loaded, problem, keys, True, part=roles.ALL))
    zeroth = calibration.jobs(loaded, problem, keys, True)
    first = roles.look_jobs(loaded, problem, keys, roles.ORACLE_SCHEME, roles.FIRST, float32=True, float64=True)
    rest = roles.rest_jobs(loaded, problem, keys, roles.ORACLE_SCHEME, float32=True, float64=True)
    assert Counter(j.name for j in [*zeroth, *first, *rest]) == every
    assert not [j for j in zeroth if j.role in (roles.MEMBER, *roles.FLOAT64_MEMBERS)]
    assert {j.role for j in first} == {roles.MEMBER, *kinds} and all(j.member <= roles.FIRST_LOOK for j in first)
    assert all(j.member > roles.FIRST_LOOK for j in rest)
    assert {j.role for j in rest} == kinds


def check(verdict: CheckVerdict, a: RunKey, name: str = "a check") -> checks.Check:
    return checks.Check(name, a, ORACLE_KEY, verdict, "rule")


NUMPY64 = RunKey("numpy", "cpu", precision=FLOAT64)  # the oracle's own code: judged against the oracle, not a library's formula
SEGMENT = "math_anchored_outputs"  # a re-anchored check: the re-anchored members' spread


@pytest.mark.parametrize(
    "name, standing, kinds",
    [
        ("gpl_transformer", [], set()),
        ("gpl_transformer", [check(CheckVerdict.SKIPPED, JAX), check(CheckVerdict.SKIPPED, TWIN)], set()),  # nothing more members can judge
        ("gpl_transformer", [check(CheckVerdict.FAIL, JAX)], {roles.MEMBER}),
        ("gpl_transformer", [check(CheckVerdict.KNOWN, JAX)], {roles.MEMBER}),  # known or passing: only all the members say which
        # its JAX twin is judged against optax's formula, on the members computing it: not the oracle's own
        ("gpl_transformer", [check(CheckVerdict.FAIL, TWIN)], {roles.LIBRARY_MEMBER}),
        ("gpl_transformer", [check(CheckVerdict.FAIL, NUMPY64)], {roles.MEMBER64}),
        ("gpl_transformer", [check(CheckVerdict.FAIL, NUMPY64), check(CheckVerdict.FAIL, TWIN)], {roles.MEMBER64, roles.LIBRARY_MEMBER}),
        ("gpl_transformer", [check(CheckVerdict.FAIL, JAX), check(CheckVerdict.KNOWN, TWIN)], {roles.MEMBER, roles.LIBRARY_MEMBER}),
        # moons_net's twins are judged against the oracle, re-anchored too: each check its own kind
        ("moons_net", [check(CheckVerdict.FAIL, TWIN)], {roles.MEMBER64}),
        ("moons_net", [check(CheckVerdict.FAIL, TWIN, SEGMENT)], {roles.ANCHORED_MEMBER}),
        ("moons_net", [check(CheckVerdict.FAIL, TWIN, SEGMENT), check(CheckVerdict.KNOWN, NUMPY64)], {roles.ANCHORED_MEMBER, roles.MEMBER64}),
    ],
)
@pytest.mark.parametrize("look", ["first", "rest"])
def test_the_first_and_the_rest_of_the_members_run_for_the_checks_they_calibrate_only(name, standing, kinds, look):
    """After the zeroth look (no member), the first look's members of the kinds whose checks
    do not pass; after the first look, the rest of those kinds (calibration.top_up), never one
    that ran. A twin's check reads one float64 spread (Calibration.spread_of, segments_of), so
    only the members of that kind run for it."""
    loaded, problem = load_spec(SPECS_DIR / f"{name}.yaml", "quick"), quick_problem(name)
    keys = plan.matrix_keys(["jax", "numpy"], ["cpu"])
    planned = calibration.jobs(loaded, problem, keys, True, part=roles.ZEROTH if look == "first" else roles.FIRST)
    asked: list = []

    def run(jobs, done=None):
        asked.extend(jobs)
        return {}

    passing = [
        check(CheckVerdict.PASS, JAX),
        check(CheckVerdict.PASS, TWIN),
        check(CheckVerdict.PASS, CALIBRATION_KEY),
        check(CheckVerdict.PASS, TWIN, SEGMENT),
    ]
    looking = calibration.first_look if look == "first" else calibration.top_up
    looked = looking(loaded, problem, keys, planned, {}, {}, [*passing, *standing], run, Console(file=io.StringIO()))
    assert {j.role for j in asked} == kinds
    assert (looked is None) == (not kinds)
    if look == "first":
        assert all(j.member <= roles.FIRST_LOOK for j in asked)
    else:
        assert all(j.member > roles.FIRST_LOOK for j in asked)  # never one that ran
    computing = {j.keys[0].variant.split("-order")[0] for j in asked if j.role == roles.LIBRARY_MEMBER}
    assert computing <= {"as-jax"}  # only the formula of the library whose twin's check stands


EXPLAINS = re.compile(r"([\d.e+-]+) of what (?:it explains|they explain)")  # a known check's share of its entry's reach


def verdicts(name: str, epochs: int, frameworks: list[str]):
    if name.startswith("examples/"):  # a user's port as its folder has it (epochs: its own)
        loaded = load_spec(PROJECT_ROOT / name)
        short_problem = build_problem(loaded)
    else:
        loaded, short_problem = short_quick(name, epochs)
    out = io.StringIO()
    result = matrix.run_cells(loaded, short_problem, plan.matrix_keys(frameworks, ["cpu"]), None, Console(file=out, width=300), repeats=1)
    return result, out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, epochs, frameworks, topped, library_known, plain64",
    [
        ("mnist_mlp", 1, ["torch", "jax", "numpy"], False, False, None),  # on the real MNIST files: every check passes on the first look
        ("peaks_mlp", 4, ["jax", "numpy"], False, True, None),  # optax's bias corrections explain every check that does not pass
        ("peaks_mlp", 100, ["torch", "jax", "numpy"], True, True, None),  # and checks no entry covers: every member
        # JAX's twin judged against optax's formula, NumPy's against the oracle: only the kind
        # of float64 member a standing check reads runs (roles.Kind), the oracle's own keeps its floor
        ("gpl_transformer", 1, ["jax", "numpy"], False, True, False),
        # a port (torch's float64 run the reference): optax's bias corrections explain JAX's
        # float32 checks that do not pass, on the library look's member
        ("examples/mnist_port/mnist_port.yaml", 1, ["torch", "jax"], False, True, None),
    ],
)
def test_a_matrix_gives_the_verdicts_of_every_member(members_from_the_start, name, epochs, frameworks, topped, library_known, plain64):
    """The same matrix with the zeroth and first looks and with every member from the start:
    the same check by check verdicts and diagnoses; each passing check's tolerance no wider on
    the looks' members, a check that does not pass the same to the bit where every member
    ran. A float32 check its library entries explain on the first look's members
    (diagnosis.library_known) runs no more of the envelope's: with every member it is
    known as well, or passes, on a tolerance no narrower."""
    members_from_the_start(roles.ZEROTH)  # as a matrix plans: no member at first
    first, said = verdicts(name, epochs, frameworks)
    looked = roles.FIRST_LOOK if re.search(r"running the first look's \d+ float32", said) else 0
    assert ("do not pass on the first look's members" in said) == topped
    explained = {id(c) for c in first.checks if diagnosis.library_known(first.problem.spec, c)}
    assert bool(explained) == library_known
    members_from_the_start(roles.ALL)
    every, said_every = verdicts(name, epochs, frameworks)
    assert "first look" not in said_every and "zeroth look" not in said_every
    assert [(c.name, c.a, c.b) for c in first.checks] == [(c.name, c.a, c.b) for c in every.checks]
    for a, b in zip(first.checks, every.checks):
        if id(a) in explained:
            assert b.verdict in (CheckVerdict.KNOWN, CheckVerdict.PASS) and (a.ratio or 0) >= (b.ratio or 0), a.name
            continue
        assert a.verdict == b.verdict, a.name
        if b.verdict == CheckVerdict.PASS:
            assert (a.ratio or 0) >= (b.ratio or 0) or a.ratio == b.ratio == 0  # the first look's spread is a part of every member's
        elif b.verdict == CheckVerdict.KNOWN:  # its library's members too: a reach no further on the first look's
            assert a.ratio == b.ratio and EXPLAINS.sub("", a.diagnosis) == EXPLAINS.sub("", b.diagnosis), a.name
            assert float(EXPLAINS.search(a.diagnosis)[1]) >= float(EXPLAINS.search(b.diagnosis)[1])
        else:
            assert (a.ratio, a.diagnosis) == (b.ratio, b.diagnosis), a.name
    spec = first.problem.spec.checks
    if plain64 is not None:  # whether the oracle's own float64 members ran on the looks, and a library's did
        assert bool(first.members64) == plain64 and "(math parity's calibration, jax's formula)" in said
        assert len(every.members64) == spec.math_parity.members
    assert len(every.members) == spec.long_run.members
    assert len(first.members) == (spec.long_run.members if topped else looked)


def _first_steps_apart(problem, key: RunKey, first: int):
    """`key`'s whole run, math parity's reference read from it (runner.first_steps), and a
    run of the first `first` steps alone."""
    from dataclasses import replace

    from harness.inputs.problem import truncated
    from harness.run import runner

    problem = replace(
        problem,
        spec=problem.spec.model_copy(
            update={
                "checks": problem.spec.checks.model_copy(update={"math_parity": problem.spec.checks.math_parity.model_copy(update={"steps": first})})
            }
        ),
    )
    assert problem.twin_steps == first < problem.total_steps
    whole = runner.run(problem, key)
    at = replace(key, variant=f"first{first}")
    return runner.first_steps(whole, at, first), runner.run(truncated(problem, first), key)


def _same(read, alone) -> None:
    import numpy as np

    assert read is not None and read.status == alone.status == "ok"
    assert np.array_equal(read.losses, alone.losses)
    for field in ("final_params", "snapshots", "layer_outputs"):
        mine, theirs = getattr(read, field), getattr(alone, field)
        assert mine.keys() == theirs.keys(), field
        for name in theirs:
            if isinstance(theirs[name], dict):
                assert all(np.array_equal(mine[name][k], v) for k, v in theirs[name].items()), (field, name)
            else:
                assert np.array_equal(mine[name], theirs[name]), (field, name)
    assert np.array_equal(read.initial_outputs, alone.initial_outputs) and np.array_equal(read.final_outputs, alone.final_outputs)


@pytest.mark.parametrize("name,epochs,first", [("moons_net", 12, 5), ("cnn_norm_mnist", 1, 3)])
def test_math_paritys_reference_read_from_the_oracles_whole_run_is_a_run_of_its_first_steps(name, epochs, first):
    """The reference over the twins' first steps is not run on its own where the oracle's
    whole run is in the matrix (issue 54): the oracle keeps its state at that step, and what
    runner.first_steps reads from it is a run of those steps alone, bit for bit: losses,
    parameters (batch norm's running statistics too), snapshots, the probe's outputs and the
    first batch's layer outputs (moons_net full-batch; the CNN with batch norm and dropout
    on minibatches of the real MNIST files)."""
    _, problem = short_quick(name, epochs)
    _same(*_first_steps_apart(problem, ORACLE_KEY, first))


def test_a_ports_reference_read_from_its_whole_run_is_a_run_of_its_first_steps():
    """The same for a port, whose reference is torch's float64 run of the user's module."""
    from harness.core.paths import PROJECT_ROOT
    from harness.core.registry import PORT_REFERENCE_KEY
    from harness.inputs.problem import build_problem

    pytest.importorskip("torch")
    problem = build_problem(load_spec(PROJECT_ROOT / "examples" / "mlp_port" / "mlp_port.yaml"))
    _same(*_first_steps_apart(problem, PORT_REFERENCE_KEY, 4))


def test_a_matrix_reads_math_paritys_reference_from_the_oracles_whole_run(monkeypatch):
    """In a matrix, math parity's reference over the first steps is the oracle's whole run's
    (no run of its own), and every check is what it is on a reference run on its own."""
    from harness.execute import schedule

    loaded, problem = short_quick("peaks_mlp", 2)
    keys = plan.matrix_keys(["torch", "jax"], ["cpu"])

    def judged() -> tuple[str, list]:
        out = io.StringIO()
        result = matrix.run_cells(loaded, problem, keys, None, Console(file=out, width=300))
        return out.getvalue(), [(c.name, c.a, c.b, c.verdict, c.ratio) for c in result.checks]

    read, checks_read = judged()
    assert re.search(r"oracle@cpu~first\d+ \(math parity's reference\): read from oracle@cpu's whole run", read)
    monkeypatch.setattr(schedule, "first_steps", lambda *_, **__: None)  # the reference runs on its own
    alone, checks_alone = judged()
    assert "read from" not in alone and "math parity's reference" in alone
    assert any(name.startswith("math_") for name, *_ in checks_alone) and checks_read == checks_alone


def _with_parity(problem, steps: int, every: int):
    """`problem` with math parity over `steps` steps, re-anchored every `every` steps."""
    from dataclasses import replace

    parity = problem.spec.checks.math_parity.model_copy(update={"steps": steps, "every": every})
    return replace(problem, spec=problem.spec.model_copy(update={"checks": problem.spec.checks.model_copy(update={"math_parity": parity})}))


NUMPY64 = RunKey("numpy", "cpu", precision=FLOAT64)


@pytest.mark.parametrize("name,epochs", [("moons_net", 16), ("cnn_norm_mnist", 1)])
def test_numpys_float64_twin_read_from_the_oracles_whole_run_is_a_run_of_its_own(name, epochs):
    """NumPy's float64 twin is the oracle's code (roles.same_code), so its runs are read from
    the oracle's whole run (issue 54: 10 s of moons_net's quick verdict trained it twice):
    over the first steps (runner.first_steps) and re-anchored (anchored.segments_read), what
    is read is what the twin's own runs give, bit for bit: losses, its metrics on the whole
    sets, every tensor (batch norm's
    running statistics and the optimizer's state at each segment's end too) and the probe's
    outputs (moons_net full-batch; the CNN with batch norm and dropout on minibatches of the
    real MNIST files)."""
    import numpy as np

    from harness.run import anchored, runner

    assert roles.same_code(NUMPY64, ORACLE_KEY) and not roles.same_code(TWIN, ORACLE_KEY)
    assert not roles.same_code(RunKey("cupy", "gpu", precision=FLOAT64), ORACLE_KEY)
    _, problem = short_quick(name, epochs)
    problem = _with_parity(problem, 3, 4)
    assert len(problem.anchors) >= 2
    whole = runner.run_alternating(problem, [ORACLE_KEY], first_metrics=True)[ORACLE_KEY]
    first, own = runner.first_steps(whole, NUMPY64, 3, metrics=True), runner.run(truncated(problem, 3), NUMPY64)
    _same(first, own)
    assert first.metrics == own.metrics and set(own.metrics) >= {"train_loss", "train_accuracy"}
    at = anchored.anchored_key(NUMPY64)
    read, alone = anchored.segments_read(whole, at, 3), anchored.run_segments(problem, at, whole.anchor_states)
    assert read is not None and alone.status == "ok" and read.segments.keys() == alone.segments.keys() == set(problem.anchors)
    for start in problem.anchors:
        assert np.array_equal(read.segments[start], alone.segments[start])
        assert np.array_equal(read.segment_outputs[start], alone.segment_outputs[start])
        ends, theirs = read.segment_ends[start], alone.segment_ends[start]
        assert ends.keys() == theirs.keys() and all(np.array_equal(ends[k], v) for k, v in theirs.items()), start


def test_a_matrix_reads_numpys_float64_twin_from_the_oracles_whole_run(monkeypatch):
    """In a matrix with NumPy, its float64 twin (first steps and re-anchored) is read from the
    oracle's whole run, its record says so, and every check is what it is on the twin's own
    runs."""
    from harness.execute import schedule
    from harness.records import build

    loaded, problem = short_quick("moons_net", 16)
    problem = _with_parity(problem, 3, 4)
    keys = plan.matrix_keys(["numpy"], ["cpu"])

    def judged() -> tuple[str, list, dict]:
        out = io.StringIO()
        result = matrix.run_cells(loaded, problem, keys, None, Console(file=out, width=300))
        return out.getvalue(), sorted((c.name, c.a.label, c.b.label, c.verdict, c.ratio) for c in result.checks), result.outcomes

    read, checks_read, outcomes = judged()
    assert "numpy@cpu+float64 (float64 twin, first 3 steps): read from oracle@cpu's whole run, which kept its first steps" in read
    assert "numpy@cpu+float64~anchored (float64 twin, re-anchored): read from oracle@cpu's whole run, which kept its segment ends" in read
    assert "read from oracle@cpu's run" in build.implementation(NUMPY64, outcomes[NUMPY64].describe)
    monkeypatch.setattr(schedule, "_read", lambda *_: None)  # every run on its own
    alone, checks_alone = judged()[:2]
    assert "read from" not in alone and "numpy@cpu+float64~anchored (float64 twin, re-anchored)" in alone
    assert any(name.startswith("math_anchored") for name, *_ in checks_alone) and checks_read == checks_alone
