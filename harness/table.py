"""The verdict table printed at the end of a run."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from harness import checks as checks_mod
from harness.matrix import SpecResult
from harness.registry import ORACLE_KEY
from harness.rows import BENCH_HEADER, bench_rows, run_to_run


def _fmt(value: float | None, spec: str = ".6g") -> str:
    return "-" if value is None else format(value, spec)


def _counts(passed: int, failed: int, known: int, skipped: int) -> str:
    """`12 ok`, then only the counts that are not zero: `2 FAIL`, `3 known`, `1 skip`."""
    parts = [f"{passed} ok"] + [f"{n} {what}" for n, what in ((failed, "FAIL"), (known, "known"), (skipped, "skip")) if n]
    return " ".join(parts)


# Fits a 100-column terminal: the run labels are never cut (a calibration member's order
# is what tells it apart); the time per step and run-to-run stay; each failing check's
# details follow the table, one line each, and every number is in the record.
COLUMNS = ("run", "status", "final loss", "acc.", "horizon", "checks", "repeats", "ms/step")


def verdict_table(results: list[SpecResult]) -> Table:
    table = Table(title="Verdicts", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for column in COLUMNS:
        table.add_column(
            column,
            justify="left" if column in ("run", "status", "checks") else "right",
            no_wrap=column in ("run", "horizon", "ms/step"),
            overflow="fold",
        )
    for result in results:
        name = result.loaded.name
        if result.loaded.spec.sweep is not None and result.loaded.profile == result.loaded.spec.sweep.profile:
            name = f"{name} n={len(result.problem.x_train)}"
        table.add_row(name, style="bold")  # the spec, above its runs
        for key, outcome in result.outcomes.items():
            mine = [c for c in result.checks if c.involves(key)]
            failed = sum(c.verdict == "fail" for c in mine)
            counts = _counts(*(sum(c.verdict == v for c in mine) for v in ("pass", "fail", "known", "skipped")))
            horizon = next(
                (
                    c.horizon_steps
                    for check_name in ("loss_curve_horizon", "loss_curve_envelope", "math_loss_curve")
                    for c in mine
                    if c.name == check_name and c.other(key) == ORACLE_KEY and c.horizon_steps is not None
                ),
                None,
            )
            acc = outcome.metrics.get("val_accuracy", outcome.metrics.get("train_accuracy"))
            status = outcome.status if outcome.status != "ok" or not failed else "ok, FAIL"
            style = "red" if failed or outcome.status == "failed" else "yellow" if outcome.status == "skipped" else None
            table.add_row(
                key.label,
                status,
                _fmt(outcome.metrics.get("train_loss"), ".5g"),
                _fmt(acc, ".4f"),
                "-" if horizon is None else f"{horizon}/{len(outcome.losses)}",
                counts,
                run_to_run(outcome),
                _fmt(outcome.timings["per_step_s"] * 1e3 if outcome.timings else None, ".3f"),
                style=style,
            )
        for member in result.members:
            table.add_row(
                member.key.label,
                "member" if member.status == "ok" else member.status,
                _fmt(member.metrics.get("train_loss"), ".5g"),
                _fmt(member.metrics.get("val_accuracy", member.metrics.get("train_accuracy")), ".4f"),
                "-",
                "calibrates",
                "-",
                _fmt(member.timings["per_step_s"] * 1e3 if member.timings else None, ".3f"),
                style="dim",
            )
    return table


def failure_line(spec_name: str, c: checks_mod.Check) -> str:
    """One line per failing or known check: FAIL (or KNOWN), the pair, the check, the measured
    error against its tolerance, and last the diagnosis."""
    label = c.verdict.upper() if checks_mod.gating(c) else f"{c.verdict.upper()} (TF32: measured, not gated)"
    measured = ""
    if c.max_abs_error is not None:
        measured = f" max abs {c.max_abs_error:.3g}, max rel {c.max_rel_error:.3g}"
    if c.ratio is not None:
        measured += f", {c.ratio:.3g}x its tolerance"
    tolerance = f" [{c.tolerance}]" if c.verdict == "fail" else ""
    return f"{label} {spec_name} {c.a.label} vs {c.b.label}: {c.name}:{measured}{tolerance}; diagnosis: {c.diagnosis}"


def print_failures(console: Console, results: list[SpecResult]) -> None:
    reasons: dict[str, str] = {}
    for result in results:
        for c in result.checks:
            if c.verdict in ("fail", "known"):
                console.print(
                    failure_line(result.loaded.name, c),
                    style="red" if c.verdict == "fail" else "yellow",
                    highlight=False,
                    soft_wrap=True,
                    markup=False,
                )
                if c.verdict == "known" and c.reason:
                    reasons.setdefault(c.diagnosis.split(";")[0], c.reason)
        for outcome in [*result.outcomes.values(), *result.members, *result.members64]:
            key = outcome.key
            if outcome.status != "ok":
                console.print(
                    f"{outcome.status.upper()} {result.loaded.name} {key.label}: {outcome.reason}",
                    highlight=False,
                    soft_wrap=True,
                    markup=False,
                )
    for what, reason in reasons.items():  # each known difference explained once
        console.print(f"{what}: {reason}", style="dim", highlight=False, soft_wrap=True, markup=False)


def failed(results: list[SpecResult]) -> bool:
    return any(c.verdict == "fail" and checks_mod.gating(c) for r in results for c in r.checks) or any(
        o.status == "failed" for r in results for o in [*r.outcomes.values(), *r.members, *r.members64]
    )


def speed_table(written: list) -> Table | None:
    """GPU-over-CPU speedups of the records just written, where both sides ran."""
    from harness import speed

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
            row.cell.precision_mode,
            f"{row.cpu.timings.per_step_s * 1e3:.3f}",
            f"{row.gpu.timings.per_step_s * 1e3:.3f}",
            f"{row.speedup:.1f}x",
            f"{row.speedup_with_transfers:.1f}x",
        )
    return table


def bench_table(written: list) -> Table:
    """The report's eager-and-fast table (harness.report.bench_rows), in the terminal."""
    table = Table(title="Eager and fast modes against the hardware floor (median time per step, compile excluded)")
    for column in BENCH_HEADER:
        table.add_column(column, justify="right" if "ms" in column or "/" in column else "left")
    for row in bench_rows(written):
        table.add_row(*(cell.replace("**", "") for cell in row))  # markdown bold means nothing here
    return table
