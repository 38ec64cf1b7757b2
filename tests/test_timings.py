"""tools/timings.py on the lines a matrix prints: training seconds per role, and, from a log
whose lines carry the time they were written, each side's wall seconds."""

from __future__ import annotations

import io
import subprocess
import sys

from rich.console import Console

from harness.core.registry import RunKey
from harness.execute import jobs, schedule
from harness.run.runner import Outcome
from tests.conftest import ROOT


def _lines(job: jobs.Job, outcome: Outcome) -> tuple[str, list[str]]:
    """The line a job prints as it starts, and those it prints as it ends."""
    out = io.StringIO()
    console = Console(file=out, width=200)
    schedule._announce(console, job, 100)
    start = out.getvalue().splitlines()
    schedule._report(console, job, {outcome.key: outcome})
    return start[0], out.getvalue().splitlines()[len(start) :]


def _timings(tmp_path, lines: list[str]) -> str:
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines) + "\n")
    return subprocess.run([sys.executable, "tools/timings.py", str(log)], capture_output=True, text=True, cwd=ROOT, check=True).stdout


def _job(key: RunKey, label: str, role: str = "run", repeats: int = 1) -> jobs.Job:
    return jobs.Job(key.label, role, ((key, label),), repeats=repeats)


def test_a_stamped_log_gives_each_sides_training_and_wall_seconds_and_says_what_did_not_finish(tmp_path):
    torch, oracle, member = RunKey("torch", "cpu"), RunKey("oracle", "cpu", precision="float64"), RunKey("numpy", "cpu", variant="order1")
    ran = Outcome(torch, "ok", metrics={"train_loss": 0.5}, timings={"train_s": 1.5})
    reference = Outcome(oracle, "ok", metrics={"train_loss": 0.5}, timings={"train_s": 4.0})
    broke = Outcome(member, "failed", reason="diverged at step 3")
    torch_start, torch_end = _lines(_job(torch, "moons_net torch@cpu", repeats=2), ran)
    oracle_start, oracle_end = _lines(_job(oracle, "moons_net oracle@cpu"), reference)
    member_start, member_end = _lines(_job(member, "moons_net numpy@cpu~order1 (calibration: its sums in another order)"), broke)
    plain = [torch_start, *torch_end, oracle_start, *oracle_end, member_start, *member_end, "3 records written"]
    # 10 s for torch's two repeats (3 s of training), 25 s for the oracle (4 s), 6 for the member that failed
    at = [0, 10, 10, 35, 35, 41, 41]
    stamped = [f"12:00:{t:02d} {line}" for t, line in zip(at, plain)]

    unstamped = _timings(tmp_path, plain)
    assert "| moons_net | torch@cpu | framework runs | 100 | 2 | 3.0 |" in unstamped
    assert "| moons_net | oracle@cpu | oracle | 100 | 1 | 4.0 |" in unstamped
    assert "The verdict's runs trained 4.0 s, the frameworks' runs 3.0 s: 1.33x" in unstamped
    # the member failed (no training line): before any member, the oracle's 4 s
    before = "Before any member (the verdict's runs but its calibration and re-anchored members): 4.0 s, 1.33x of the frameworks' runs"
    assert f"{before}; the members 0.0 s" in unstamped
    assert "Wall" not in unstamped  # no stamps, no wall seconds

    table = _timings(tmp_path, stamped)
    assert table.count("| moons_net |") == unstamped.count("| moons_net |")  # the same runs, the stamps read off
    wall = table.splitlines()[-1]
    assert wall == (
        "Wall (each run from its first line to the next run's): the verdict's runs 25 s, the frameworks' runs 10 s: 2.50x "
        "(1 run(s) that did not finish left out); the log spans 41 s"
    )


def test_a_stamped_log_past_midnight_counts_the_day(tmp_path):
    torch = RunKey("torch", "cpu")
    start, end = _lines(_job(torch, "moons_net torch@cpu"), Outcome(torch, "ok", metrics={"train_loss": 0.5}, timings={"train_s": 1.0}))
    lines = [f"23:59:50 {start}", *(f"00:00:05 {line}" for line in end), "00:00:07 1 records written"]
    assert _timings(tmp_path, lines).splitlines()[-1].endswith("the verdict's runs 0 s, the frameworks' runs 17 s: 0.00x; the log spans 17 s")


def test_the_members_are_counted_apart_from_the_verdicts_runs_before_any_member(tmp_path):
    """A calibration member and a re-anchored member are the members; the oracle and a
    re-anchored twin are the verdict before any member (what no calibration policy leaves out)."""
    import numpy as np

    from harness.calibrate import roles

    torch, oracle = RunKey("torch", "cpu"), RunKey("oracle", "cpu", precision="float64")
    member, anchored = (
        RunKey("oracle", "cpu", precision="float64", variant="order1"),
        RunKey("oracle", "cpu", precision="float64", variant="order1-anchored"),
    )
    twin = RunKey("torch", "cpu", precision="float64", variant="anchored")
    lines = []
    for key, label, role, seconds in [
        (torch, "moons_net torch@cpu", "run", 2.0),
        (oracle, "moons_net oracle@cpu", "run", 3.0),
        (member, "moons_net oracle@cpu~order1 (math parity's calibration)", roles.MEMBER64, 1.5),
        (anchored, "moons_net oracle@cpu~order1-anchored (re-anchored math parity's calibration)", roles.ANCHORED_MEMBER, 2.5),
        (twin, "moons_net torch@cpu+float64~anchored (float64 twin, re-anchored)", roles.ANCHORED_TWIN, 1.0),
    ]:
        outcome = Outcome(key, "ok", metrics={"train_loss": 0.5}, timings={"train_s": seconds})
        if "anchored" in key.variant:
            outcome.segments = {100: np.zeros(50), 150: np.zeros(50)}
        start, end = _lines(_job(key, label, role), outcome)
        lines += [start, *end]
    table = _timings(tmp_path, [*lines, "5 records written"])
    assert "| moons_net | oracle@cpu~order1-anchored | re-anchored members | 100 | 1 | 2.5 |" in table
    assert "| moons_net | torch@cpu+float64~anchored | re-anchored runs | 100 | 1 | 1.0 |" in table
    assert "The verdict's runs trained 8.0 s, the frameworks' runs 2.0 s: 4.00x" in table
    assert "members): 4.0 s, 2.00x of the frameworks' runs; the members 4.0 s" in table
