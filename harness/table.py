"""The verdict table printed at the end of a run."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from harness import checks as checks_mod
from harness.matrix import SpecResult
from harness.report import run_to_run
from harness.registry import ORACLE_KEY


def _fmt(value: float | None, spec: str = ".6g") -> str:
    return "-" if value is None else format(value, spec)


def verdict_table(results: list[SpecResult]) -> Table:
    table = Table(title="Verdicts", show_lines=False)
    for column in ("spec", "run", "status", "final loss", "accuracy", "horizon vs oracle", "checks", "repeats", "train s", "ms/step"):
        table.add_column(column, justify="left" if column in ("spec", "run", "status") else "right")
    for result in results:
        total = result.problem.total_steps
        name = result.loaded.name
        if result.loaded.spec.sweep is not None and result.loaded.profile == result.loaded.spec.sweep.profile:
            name = f"{name} n={len(result.problem.x_train)}"
        for key, outcome in result.outcomes.items():
            mine = [c for c in result.checks if c.involves(key)]
            passed = sum(c.verdict == "pass" for c in mine)
            failed = sum(c.verdict == "fail" for c in mine)
            skipped = sum(c.verdict == "skipped" for c in mine)
            known = sum(c.verdict == "known" for c in mine)
            horizon = next(
                (c.horizon_steps for c in mine if c.name == "loss_curve_horizon" and c.other(key) == ORACLE_KEY), None
            )
            acc = outcome.metrics.get("val_accuracy", outcome.metrics.get("train_accuracy"))
            status = outcome.status if outcome.status != "ok" or not failed else "ok, checks fail"
            style = "red" if failed or outcome.status == "failed" else "yellow" if outcome.status == "skipped" else None
            table.add_row(
                name,
                f"{key.label} {key.dtype}",
                status,
                _fmt(outcome.metrics.get("train_loss")),
                _fmt(acc, ".4f"),
                "-" if horizon is None else f"{horizon}/{total}",
                f"{passed} ok, {failed} fail, {known} known, {skipped} skip",
                run_to_run(outcome),
                _fmt(outcome.timings.get("train_s"), ".2f"),
                _fmt(outcome.timings["per_step_s"] * 1e3 if outcome.timings else None, ".3f"),
                style=style,
            )
        for member in result.members:
            table.add_row(
                name,
                f"{member.key.label} float32",
                f"{member.status} (calibration)",
                _fmt(member.metrics.get("train_loss")),
                _fmt(member.metrics.get("val_accuracy", member.metrics.get("train_accuracy")), ".4f"),
                "-",
                "defines the envelope",
                "-",
                _fmt(member.timings.get("train_s"), ".2f"),
                _fmt(member.timings["per_step_s"] * 1e3 if member.timings else None, ".3f"),
                style="dim",
            )
    return table


def print_failures(console: Console, results: list[SpecResult]) -> None:
    for result in results:
        for c in result.checks:
            if c.verdict in ("fail", "known"):
                label = c.verdict.upper() if checks_mod.gating(c) else f"{c.verdict.upper()} (TF32: measured, not gated)"
                where = f" (first at step {c.first_failure_step})" if c.first_failure_step is not None else ""
                measured = (
                    f"max abs {c.max_abs_error:.3g}, max rel {c.max_rel_error:.3g}{where}; "
                    if c.max_abs_error is not None
                    else ""
                )
                console.print(
                    f"{label} {result.loaded.name} {c.a.label} vs {c.b.label}: {c.name}: "
                    f"{measured}tolerance {c.tolerance}" + (f"; {c.reason}" if c.reason else ""),
                    style="red" if c.verdict == "fail" else "yellow",
                    highlight=False,
                    soft_wrap=True,
                )
        for outcome in [*result.outcomes.values(), *result.members]:
            key = outcome.key
            if outcome.status != "ok":
                console.print(
                    f"{outcome.status.upper()} {result.loaded.name} {key.label}: {outcome.reason}",
                    highlight=False,
                    soft_wrap=True,
                )


def failed(results: list[SpecResult]) -> bool:
    return any(c.verdict == "fail" and checks_mod.gating(c) for r in results for c in r.checks) or any(
        o.status == "failed" for r in results for o in [*r.outcomes.values(), *r.members]
    )


def speed_table(written: list) -> Table | None:
    """GPU-over-CPU speedups of the records just written, where both sides ran."""
    from harness import speed

    rows = [r for r in speed.speed_rows(written) if r.speedup is not None]
    if not rows:
        return None
    table = Table(title="Speedup, GPU over CPU (same host, same framework; compile and warm-up excluded)")
    for column in ("spec", "examples", "framework", "GPU math", "CPU ms/step", "GPU ms/step", "speedup", "with transfers"):
        table.add_column(column, justify="left" if column in ("spec", "framework", "GPU math") else "right")
    for row in rows:
        table.add_row(
            row.cell.spec,
            str(row.cell.n_train),
            row.cell.framework,
            row.cell.precision_mode,
            f"{row.cpu.timings.per_step_s * 1e3:.3f}",
            f"{row.gpu.timings.per_step_s * 1e3:.3f}",
            f"{row.speedup:.1f}x",
            f"{row.speedup_with_transfers:.1f}x",
        )
    return table


def _ms(outcome) -> str:
    if outcome is None:
        return "not run"
    if outcome.status != "ok":
        return outcome.status
    return f"{outcome.timings['per_step_s'] * 1e3:.4g}"


def _over(outcome, seconds: float | None) -> str:
    if outcome is None or outcome.status != "ok" or not seconds:
        return "-"
    return f"{outcome.timings['per_step_s'] / seconds:.3g}"


def agreement(result: SpecResult, key) -> str:
    """How a run's gating checks came out: ok, or the counts of failures and known differences."""
    mine = [c for c in result.checks if c.involves(key) and checks_mod.gating(c)]
    fails = sum(c.verdict == "fail" for c in mine)
    known = sum(c.verdict == "known" for c in mine)
    if not mine:
        return "-"
    return "ok" if not fails and not known else ", ".join(p for p in (f"{fails} fail" if fails else "", f"{known} known" if known else "") if p)


def bench_table(results: list[SpecResult], rates: dict) -> Table:
    """Eager and fast side by side per spec, framework, device and precision: the median
    time per step, fast over eager, each against the floor, and the fast run's checks."""
    from harness.floor import floor
    from harness.registry import EAGER, FAST, ORACLE

    table = Table(title="Eager and fast modes against the hardware floor (median time per step, compile excluded)")
    columns = ("spec", "run", "eager ms", "fast ms", "fast/eager", "floor ms", "bound", "eager/floor", "fast/floor", "fast checks")
    for column in columns:
        table.add_column(column, justify="left" if column in ("spec", "run", "bound", "fast checks") else "right")
    for result in results:
        cells: dict[tuple, dict] = {}
        for key, outcome in result.outcomes.items():
            if key.framework != ORACLE:
                cells.setdefault((key.framework, key.device, key.precision), {})[key.mode] = outcome
        for (framework, device, precision), modes in cells.items():
            eager, fast = modes.get(EAGER), modes.get(FAST)
            found = rates.get((device, precision))
            step_floor = floor(result.problem, found) if found else None
            seconds = step_floor.floor_s if step_floor else None
            ratio = "-"
            if eager and fast and eager.status == fast.status == "ok":
                ratio = f"{eager.timings['per_step_s'] / fast.timings['per_step_s']:.3g}x"
            label = f"{framework}@{device}" + ("" if precision == "strict" else f"+{precision}")
            table.add_row(
                result.loaded.name,
                label,
                _ms(eager),
                _ms(fast),
                ratio,
                "-" if seconds is None else f"{seconds * 1e3:.3g}",
                step_floor.bound if step_floor else "-",
                _over(eager, seconds),
                _over(fast, seconds),
                agreement(result, fast.key) if fast else "-",
            )
    return table
