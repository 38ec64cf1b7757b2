"""A run's verdict as the Python API hands it over (harness.run_spec, harness.check_port):
whether it passed, each failing check with its diagnosis as fields, the schema records as
dicts, and the table and FAIL lines the command line prints, as its text."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from harness.core.registry import CheckVerdict
from harness.records.store import run_label
from harness.report.table import diagnosis_kind, named_module

# A failed run's Failure: its check, and its diagnosis's kind (its detail: the run's reason).
RUN_CHECK, RUN_FAILED = "run", "failed"


@dataclass(frozen=True)
class Failure:
    """One failing check: its name, the run judged and the run it is judged against, the
    diagnosis's kind ("implementation", "rounding", "undiagnosed", ...) and its text, the
    module (or layer) it names (None where it names none), the step where it starts (None
    where it has none), and its error over its tolerance. A run that failed (it raised, or
    its process died) is one too: check RUN_CHECK, diagnosis RUN_FAILED, its reason the
    detail, judged against no run (reference None). `gated` is False for a check measured
    and not gated (a TF32 or bf16 run's: registry.gates), which fails no verdict."""

    check: str
    run: str
    reference: str | None
    diagnosis: str
    module: str | None
    step: int | None
    ratio: float | None
    detail: str
    gated: bool = True


def _step(text: str, check) -> int | None:
    starts = re.search(r"starts at step (\d+)", text)
    if starts:
        return int(starts.group(1))
    return check.first_failure_step


class Verdict:
    """What a run of the matrix found, from Python: `passed` (no gating check failed and no
    run failed, other than by diverging no earlier than rounding alone does: table.failed),
    `failures` (each failing check and each failed run, `Failure`: never empty where not
    passed; a check measured and not gated, a bf16 or TF32 run's, is one with `gated`
    False), `records` (the schema records, as dicts) and `str(verdict)`, the verdict table
    and the FAIL lines the command line prints."""

    def __init__(self, results: list, text: str):
        from harness.report.rows import gating
        from harness.report.table import failed, failed_runs, problem_checks

        self.results = results
        self._text = text
        self.passed = not failed(results)
        found = []
        for result in results:
            for record, c in problem_checks(result.records):
                if c.verdict != CheckVerdict.FAIL:
                    continue
                detail = c.diagnosis or ""
                found.append(
                    Failure(
                        check=c.name,
                        run=run_label(record),
                        reference=c.against,
                        diagnosis=diagnosis_kind(detail),
                        module=named_module(detail, c.tensor),
                        step=_step(detail, c),
                        ratio=c.ratio,
                        detail=detail,
                        gated=gating(record, c),
                    )
                )
            for record in failed_runs(result):
                reason = record.reason or ""
                found.append(Failure(RUN_CHECK, run_label(record), None, RUN_FAILED, None, record.failed_at_step, None, reason))
        self.failures: list[Failure] = found
        self.records: list[dict[str, Any]] = [r.model_dump(mode="json") for result in results for r in result.records]

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return f"<Verdict {'passed' if self.passed else 'failed'}: {len(self.records)} records, {len(self.failures)} failures>"


def rendered(results: list, members: bool = False) -> str:
    """The verdict table, the cross-host table, and the FAIL and KNOWN lines, as the command
    line prints them, as text."""
    from harness.report import table

    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False, color_system=None)
    console.print(table.verdict_table(results, members=members))
    across = table.cross_host_table(results)
    if across is not None:
        console.print(across)
    seeded = table.seeds_table(results)
    if seeded is not None:
        console.print(seeded)
    table.print_failures(console, results, rest="see .failures")
    return out.getvalue()
