"""The terminal's tables at the end of a run: the records just made (written or not),
rendered with the report's row builders (harness/report/rows.py)."""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from rich import box
from rich.console import Console
from rich.table import Table

from harness.core.registry import BF16, DIVERGENCE_CHECKS, HORIZON, OVER_SEEDS, CheckVerdict, RunKey, explains, verdict_counts
from harness.records.schema import CheckRecord, Record
from harness.records.store import run_label
from harness.report.rows import BENCH_HEADER, ORACLE_LABEL, bench_rows, differing, gating, ms, problem_checks, run_to_run, theirs
from harness.verdict.bound import times_tolerance


class Shown(Protocol):
    """One spec's part of a run (matrix.SpecResult): its title and its records."""

    title: str
    records: list[Record]  # one per run
    member_records: list[Record]  # the calibration members', never written


def _fmt(value: float | None, spec: str = ".6g") -> str:
    return "-" if value is None else format(value, spec)


SAID = {CheckVerdict.FAIL: "FAIL", CheckVerdict.KNOWN: "known", CheckVerdict.SKIPPED: "skip"}


def _counts(counts: dict[CheckVerdict, int]) -> str:
    """`12 ok`, then only the counts that are not zero: `2 FAIL`, `3 known`, `1 skip`."""
    return " ".join([f"{counts[CheckVerdict.PASS]} ok"] + [f"{counts[v]} {said}" for v, said in SAID.items() if counts[v]])


# Fits a 100-column terminal: the run labels are never cut (a calibration member's order
# is what tells it apart); the time per step and run-to-run stay; each failing check's
# details follow the table, one line each, and every number is in the record.
COLUMNS = ("run", "status", "final loss", "acc.", "horizon", "checks", "repeats", "ms/step")
HORIZON_CHECKS = ("loss_curve_horizon", "loss_curve_envelope", "math_loss_curve")


def _value(record: Record, *names: str) -> float | None:
    values = record.metrics.values if record.metrics else {}
    return next((values[n] for n in names if n in values), None)


def _ms(record: Record) -> str:
    return ms(record.timings.per_step_s if record.timings else None)


def _steps(record: Record) -> int | None:
    return record.timings.total_steps if record.timings else None


def _run_row(record: Record, differ: set[str] = frozenset(), steps: int | None = None) -> tuple[list[str], str | None]:
    """A run's row; `steps`, the spec's longest run: a shorter one (a float64 twin, its first
    steps) says after which step its loss and accuracy are (`0.53436 @21`), not to be read
    beside the others' final ones."""
    counted = verdict_counts(c.verdict for c in record.checks if not theirs(record, c, differ))
    failed, counts = counted[CheckVerdict.FAIL], _counts(counted)
    horizon = next(
        (
            c.horizon_steps
            for name in HORIZON_CHECKS
            for c in record.checks
            if c.name == name and c.against == ORACLE_LABEL and c.horizon_steps is not None
        ),
        None,
    )
    total = _steps(record)
    status = record.status if record.status != "ok" or not failed else "ok, FAIL"
    rounding = diverged_as_members(record, member=False)
    style = "red" if failed or (record.status == "failed" and not rounding) else "yellow" if record.status == "skipped" or rounding else None
    at = f" @{total}" if total is not None and steps is not None and total < steps else ""
    loss, accuracy = _fmt(_value(record, "train_loss"), ".5g"), _fmt(_value(record, "val_accuracy", "train_accuracy"), ".4f")
    cells = [
        run_label(record),
        status,
        loss + at if loss != "-" else loss,
        accuracy + at if accuracy != "-" else accuracy,
        "-" if horizon is None else f"{horizon}/{total}",
        counts,
        run_to_run(record),
        _ms(record),
    ]
    return cells, style


def _member_row(record: Record) -> list[str]:
    status = "member" if record.status == "ok" else record.status
    acc = _fmt(_value(record, "val_accuracy", "train_accuracy"), ".4f")
    return [run_label(record), status, _fmt(_value(record, "train_loss"), ".5g"), acc, "-", "calibrates", "-", _ms(record)]


def _members_row(records: list[Record]) -> list[str]:
    """The calibration members of one spec, folded into one row (`--members`: one each)."""
    ok = sum(r.status == "ok" for r in records)
    status = "member" if ok == len(records) else f"{len(records) - ok} failed"
    return [f"{len(records)} members", status, "-", "-", "-", "calibrate", "-", "-"]


TITLE_WIDTH = 60


def verdict_table(results: Sequence[Shown], members: bool = False) -> Table:
    table = Table(title="Verdicts", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for column in COLUMNS:
        table.add_column(
            column,
            justify="left" if column in ("run", "status", "checks") else "right",
            no_wrap=column in ("run", "horizon", "ms/step"),
            overflow="fold",
        )
    for result in results:
        # the spec, above its runs; a long title (a port's dropouts) wrapped, so that the run
        # column, which never wraps, stays as wide as its labels
        table.add_row("\n".join(textwrap.wrap(result.title, TITLE_WIDTH)), style="bold")
        differ = differing(result.records)
        steps = max((n for n in map(_steps, result.records) if n is not None), default=None)
        for record in result.records:
            cells, style = _run_row(record, differ, steps)
            table.add_row(*cells, style=style)
        if members:
            for record in result.member_records:
                table.add_row(*_member_row(record), style="dim")
        elif result.member_records:
            table.add_row(*_members_row(result.member_records), style="dim")
    return table


def _measured(record: Record, c) -> str:
    """What a check is measured and not gated for: over seeds, or its precision, TF32 or bf16."""
    if c.name.startswith(OVER_SEEDS):
        return "over seeds"
    return "bf16" if BF16 in (record.precision_mode, RunKey.from_label(c.against).precision) else "TF32"


def failure_line(record: Record, c) -> str:
    """One line per failing or known check: FAIL (or KNOWN), the pair, the check, the measured
    error against its tolerance, and last the diagnosis."""
    label = c.verdict.upper() if gating(record, c) else f"{c.verdict.upper()} ({_measured(record, c)}: measured, not gated)"
    measured = ""
    if c.max_abs_error is not None:
        measured = f" max abs {c.max_abs_error:.3g}" + ("" if c.max_rel_error is None else f", max rel {c.max_rel_error:.3g}")
    if c.ratio is not None:
        measured += f", {times_tolerance(c.ratio)}"
    tolerance = f" [{c.tolerance}]" if c.verdict == CheckVerdict.FAIL else ""
    return f"{label} {record.spec.name} {run_label(record)} vs {c.against}: {c.name}:{measured}{tolerance}; diagnosis: {c.diagnosis}"


WIDTH = 100  # the columns a line of the verdicts fits, as the table does


def _print(console: Console, line: str, style: str | None = None) -> None:
    """One finding, wrapped to WIDTH columns, its continuation lines indented."""
    wrapped = textwrap.fill(line, width=min(WIDTH, console.width or WIDTH), subsequent_indent="    ", break_long_words=False)
    console.print(wrapped, style=style, highlight=False, soft_wrap=True, markup=False)


KNOWN_AT = re.compile(r"known \((?P<entry>[^,()]+)(?:, (?P<share>[^,()]+) of what (?:it explains|they explain))?\)")


# The module or layer a diagnosis names: where a twin's forward pass first differs, else the
# tensor whose difference is largest (harness/verdict/diagnosis.py).
FIRST_APART = re.compile(r"first differs at (?:layer|module) (?P<name>[^\s;()]+)")
LARGEST_IN = re.compile(r"largest in (?P<name>[^\s;()]+)")


def diagnosis_kind(text: str) -> str:
    """The first words of a diagnosis: implementation, rounding, undiagnosed, known, stale, not reproducible."""
    if text.startswith("known"):
        return "known"
    if text.startswith("stale"):
        return "stale"
    if text.startswith("not reproducible"):
        return "not reproducible"
    return text.split(":", 1)[0].split(" ", 1)[0]


def named_module(text: str, tensor: str | None) -> str | None:
    """The module a diagnosis names: where the forward pass first differs, else the module of
    the tensor whose difference is largest ("fc1.weight" -> "fc1")."""
    found = FIRST_APART.search(text) or LARGEST_IN.search(text)
    name = found["name"] if found else tensor
    if name is None:
        return None
    name = name.strip("`'\".,")
    return name.rsplit(".", 1)[0] if "." in name else name


def leading(problems: Sequence[tuple[Record, CheckRecord]]) -> list[bool]:
    """Whether each failing or known check (problem_checks) leads the FAIL lines (issue 84: one
    slip, one line): each known one, and one failing one per cause, the first that names it.
    A cause is the module a diagnosis names; a check naming none has the cause of its run's
    checks of the same diagnosis that name one, else its run and diagnosis of its own."""

    def run_of(r: Record, c: CheckRecord) -> tuple:
        return run_label(r), gating(r, c), diagnosis_kind(c.diagnosis or "")

    modules = [named_module(c.diagnosis or "", c.tensor) if c.verdict == CheckVerdict.FAIL else None for _, c in problems]
    named: dict[tuple, str] = {}  # a run's cause of a diagnosis: the first module its failing checks name
    for (r, c), module in zip(problems, modules, strict=True):
        if module is not None:
            named.setdefault(run_of(r, c), module)
    leader: dict[tuple, int] = {}  # each cause's leading check: the first naming its module, else the first
    for i, (r, c) in enumerate(problems):
        if c.verdict != CheckVerdict.FAIL:
            continue
        module = modules[i] or named.get(run_of(r, c))
        cause = (r.spec.name, gating(r, c), module) if module else (r.spec.name, *run_of(r, c))
        if cause not in leader or (modules[i] and not modules[leader[cause]]):
            leader[cause] = i
    leads = set(leader.values())
    return [c.verdict != CheckVerdict.FAIL or i in leads for i, (_, c) in enumerate(problems)]


def print_failures(console: Console, results: Sequence[Shown], rest: str = "see the records") -> None:
    """Where every run of a spec diverged, a line saying so first; the FAIL lines, one per
    cause and a count of the rest (`rest` says where they are), the KNOWN lines, the runs that failed or diverged, those skipped once, and each known
    difference's reason once."""
    reasons: dict[str, str] = {}
    shares: dict[str, list[str]] = {}
    for result in results:
        steps = [r.failed_at_step for r in result.records]
        if len(steps) > 1 and None not in steps:  # said first: no step-by-step check can judge the runs' ends
            what = f"at steps {min(steps)} to {max(steps)}: the optimizer's steps are beyond this workload's stability"
            _print(console, f"EVERY RUN DIVERGED {result.records[0].spec.name} {what} (a smaller learning rate trains it)", "yellow")
        problems = problem_checks(result.records)
        more = 0
        for (record, c), leads in zip(problems, leading(problems), strict=True):
            more += not leads
            if leads:
                _print(console, failure_line(record, c), "red" if c.verdict == CheckVerdict.FAIL else "yellow")
            if c.verdict == CheckVerdict.KNOWN and c.reason:
                found = KNOWN_AT.match(c.diagnosis or "")
                entry = found["entry"] if found else (c.diagnosis or "").split(";")[0]
                reasons.setdefault(entry, c.reason)
                if found and found["share"]:
                    shares.setdefault(entry, []).append(found["share"])
        if more:
            _print(console, f"... and {more} more failing check{'s' * (more != 1)} of the same causes: {rest}", "red")
        unfinished: dict[tuple[str, str, str | None], list[str]] = {}  # runs of one status and reason: one line
        for record, member in _every_run(result):
            if record.status not in ("ok", "skipped"):
                shown = "DIVERGED (as rounding alone does)" if diverged_as_members(record, member) else record.status.upper()
                unfinished.setdefault((shown, record.spec.name, record.reason), []).append(run_label(record))
        for (shown, name, reason), labels in unfinished.items():
            _print(console, f"{shown} {name} {', '.join(labels)}: {reason}", "yellow" if shown.startswith("DIVERGED") else None)
    for labels, (specs, reason) in skipped_runs(results).items():
        _print(console, f"SKIPPED {labels} on {', '.join(specs)}: {reason}", "yellow")
    for entry, reason in reasons.items():  # each known difference explained once, its checks' shares listed
        share = f", {', '.join(shares[entry])} of what {explains(entry)}" if entry in shares else ""
        what = entry if entry.startswith("known") else f"known ({entry}{share})"
        _print(console, f"{what}: {reason}", "dim")


def skipped_runs(results: Sequence[Shown]) -> dict[str, tuple[list[str], str]]:
    """Each run that did not run (a framework not installed, no GPU, a port not trained), with
    the specs it skipped and why, once. Runs skipped on the same specs for the same reason
    are one entry, their labels joined."""
    found: dict[str, tuple[list[str], str]] = {}
    for result in results:
        for record, _ in _every_run(result):
            if record.status == "skipped":
                specs, _ = found.setdefault(run_label(record), ([], record.reason or "skipped"))
                specs.append(record.spec.name)
    joined: dict[tuple[tuple[str, ...], str], list[str]] = {}
    for label, (specs, reason) in found.items():
        joined.setdefault((tuple(specs), reason), []).append(label)
    return {", ".join(labels): (list(specs), reason) for (specs, reason), labels in joined.items()}


def failed(results: Sequence[Shown]) -> bool:
    """Whether the run fails: a gating check failed, or a run (or member) failed (failed_runs)."""
    return any(c.verdict == CheckVerdict.FAIL and gating(r, c) for result in results for r, c in problem_checks(result.records)) or any(
        failed_runs(result) for result in results
    )


def failed_runs(result: Shown) -> list[Record]:
    """A spec's runs and members that failed, other than by diverging as rounding alone does
    (diverged_as_members): each fails the verdict."""
    return [r for r, member in _every_run(result) if r.status == "failed" and not diverged_as_members(r, member)]


def _every_run(result: Shown) -> list[tuple[Record, bool]]:
    """A spec's runs and then its members, each with whether it is a member."""
    return [*((r, False) for r in result.records), *((r, True) for r in result.member_records)]


def diverged_as_members(record: Record, member: bool) -> bool:
    """Whether a failed run diverged as rounding alone does: a member that diverged (its
    spread then bounds nothing after it: harness/calibrate/spread.py), or a run whose
    divergence check passes (it diverged no earlier than its members)."""
    if record.failed_at_step is None:
        return False
    return member or any(c.name in DIVERGENCE_CHECKS and c.verdict == CheckVerdict.PASS for c in record.checks)


def speed_table(written: list) -> Table | None:
    """GPU-over-CPU speedups of the records just written, where both sides ran."""
    from harness.report import speed

    rows = [r for r in speed.speed_rows(written) if r.speedup is not None]
    if not rows:
        return None
    table = Table(title="Speedup, GPU over CPU (same host, same framework; compile and warm-up excluded)")
    for column in ("spec", "examples", "framework", "mode", "GPU math", "CPU ms/step", "GPU ms/step", "speedup", "with transfers"):
        table.add_column(column, justify="left" if column in ("spec", "framework", "mode", "GPU math") else "right")
    for row in rows:
        table.add_row(
            row.cell.spec,
            str(row.cell.n_train),
            row.cell.framework,
            row.cell.mode,
            row.cell.precision,
            ms(row.cpu.timings.per_step_s),
            ms(row.gpu.timings.per_step_s),
            f"{row.speedup:.1f}x",
            f"{row.speedup_with_transfers:.1f}x",
        )
    return table


def bench_table(written: list) -> Table:
    """The report's eager-and-fast table (harness.report.rows.bench_rows), in the terminal."""
    table = Table(title="Eager and fast modes against the hardware floor (median time per step, compile excluded)")
    rows = bench_rows(written)
    host = BENCH_HEADER.index("host")
    shown = [i for i, _ in enumerate(BENCH_HEADER) if i != host or len({row[host] for row in rows}) > 1]  # one host: said below
    for i in shown:
        column = BENCH_HEADER[i]
        table.add_column(column, justify="right" if "ms" in column or "/" in column else "left", no_wrap="/" in column)
    for row in rows:
        table.add_row(*(row[i].replace("**", "") for i in shown))  # markdown bold means nothing here
    return table


def cross_host_table(results: Sequence) -> Table | None:
    """A row per run made at several places (harness/execute/hosts.py): the same bits or not,
    how far apart, and the calibrated rule's verdict."""
    rows = [(r.loaded.name, row) for r in results for row in getattr(r, "cross_host", [])]
    if not rows:
        return None
    table = Table(title="Across hosts (the same cell at each place)", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for column in ("spec", "run", "places", "hosts", "bitwise", "max abs diff", "first diff step", "verdict", "diagnosis"):
        table.add_column(column)
    for spec, row in rows:
        same = "-" if row.bitwise_identical is None else ("identical" if row.bitwise_identical else "differ")
        step = "-" if row.first_diff_step is None else str(row.first_diff_step)
        table.add_row(
            spec,
            row.key.label,
            f"{row.first} / {row.other}",
            " / ".join(row.hosts),
            same,
            _fmt(row.max_abs_diff, ".3g"),
            step,
            row.verdict,
            row.diagnosis or "",
        )
    return table


def seeds_table(results: Sequence) -> Table | None:
    """A row per measure of each pair judged over seeds (harness/verdict/seeds.py), under its
    spec's name: each side's olympic mean, the seeds' paired differences' mean beside their
    spread, the least mean difference the test can tell at these seeds (its tolerance), and
    the verdict."""
    shown = [r for r in results if getattr(r, "over_seeds", None)]
    if not shown:
        return None
    title = "Over seeds (each seed's init and batch order alike on both sides; olympic means)"
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for column in ("run vs", "measure", "seeds", "olympic", "diff.", "spread", "detectable", "verdict"):
        table.add_column(column)
    sticks = sorted({f"{row.reference.label} and {row.yardstick.label}" for r in shown for row in r.over_seeds if row.measure == HORIZON})
    if sticks:
        table.caption = (
            "horizon: the step at which each seed's loss curves part, the pair's / where rounding parts them "
            f"({'; '.join(sticks)}); diff. and spread in log(1 + step)"
        )
    for result in shown:
        table.add_row(result.loaded.name, *[""] * 7, style="bold")
        for row in result.over_seeds:
            check = next((c for c in result.checks if c.name == OVER_SEEDS + row.measure and c.a == row.run and c.b == row.reference), None)
            table.add_row(
                f"{row.run.label} vs {row.reference.label}",
                row.measure,
                f"{row.n}/{len(row.seeds)}",
                f"{_fmt(row.olympic('run'), '.4g')} / {_fmt(row.olympic('reference'), '.4g')}",
                _fmt(row.mean_difference, "+.2g"),
                _fmt(row.spread, ".2g"),
                "-" if check is None or check.bound is None else _fmt(check.bound.allowed, ".2g"),  # its tolerance, as judged
                "-" if check is None else SAID.get(check.verdict, check.verdict.value),
            )
    return table


def workers_line(records: list) -> str | None:
    """Where the runs ran (each record's worker): host, Ray node, thread cap."""
    seen = Counter()
    for w in (r.worker for r in records if r.worker is not None):
        node = f" node {w.node}" if w.node else ""
        threads = "the frameworks' own threads" if w.threads is None else f"{w.threads} thread(s)"
        seen[f"{w.hostname}{node} ({threads})"] += 1
    return "ran on: " + "; ".join(f"{where}: {n} run(s)" for where, n in seen.items()) if seen else None
