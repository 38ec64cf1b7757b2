"""Row builders: a record (or a pair of records) as the cells of a table, shared by the
report (Markdown) and the terminal (rich). Records come in; the only other thing read is
the spec a record names (its claims and data kind, through harness/records/store.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from harness.core.registry import (
    FLOAT64,
    GPU_ORACLE_KEY,
    MEASURED,
    ORACLE,
    OVER_SEEDS,
    PORT_REFERENCE_KEY,
    STRICT,
    Cell,
    CheckVerdict,
    RunKey,
    gates,
    verdict_counts,
)
from harness.records.schema import CheckRecord, Record
from harness.records.store import Unavailable, current_spec, record_order, record_spec, run_key, run_label
from harness.report.speed import SpeedRow

ORACLE_LABEL = "oracle@cpu"
NOT_RUN = "not run"
# Longer loss curves are drawn as the maximum over blocks of steps: 20,000 raw points of a
# curve that touches 0 every other step fill the plot solid.
CURVE_POINTS = 1000

BENCH_HEADER = [
    *("spec", "profile", "points", "framework", "device", "host", "eager ms/step", "fast ms/step", "fast/eager"),
    *("floor ms/step", "bound", "eager / floor", "fast / floor", "fast mode's checks"),
]


def fmt(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def ms(seconds: float | None, digits: int = 3) -> str:
    """A time per step in milliseconds, as every table shows one: `digits` significant
    digits, no exponent."""
    if seconds is None:
        return "-"
    value = seconds * 1e3
    text = f"{value:.{digits}g}"
    return f"{value:,.0f}" if "e+" in text else text  # 1234.5 with 3 digits: 1,235, not 1.23e+03


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance(records: Iterable[Record]) -> str:
    """Which records a table or figure comes from: count, hosts, commits, run ids."""
    records = list(records)
    hosts = sorted({r.host.label for r in records})
    commits = sorted({(r.git.commit or "unknown")[:10] + ("+dirty" if r.git.dirty else "") for r in records})
    runs = sorted({r.run_id for r in records})
    return f"{len(records)} record{'s' * (len(records) != 1)}; host {', '.join(hosts)}; commit {', '.join(commits)}; run {', '.join(runs)}"


def oracle_check(record: Record, name: str):
    return next((c for c in record.checks if c.name == name and c.against == ORACLE_LABEL), None)


def accuracy(record: Record) -> str:
    if record.metrics is None:
        return "-"
    values = record.metrics.values
    if "val_accuracy" in values:
        return f"{values['val_accuracy']:.4f} (val)"
    return fmt(values.get("train_accuracy"), ".4f")


def horizon_vs_oracle(record: Record) -> str:
    if record.framework == ORACLE:
        return "(reference)"
    check = oracle_check(record, "loss_curve_horizon")
    if check is None or check.horizon_steps is None:
        return "-"
    total = record.timings.total_steps if record.timings else None
    curve = f"{check.horizon_steps}/{total}" if total else str(check.horizon_steps)
    return f"{curve} (max rel {fmt(check.max_rel_error, '.2g')})"


def final_loss_vs_oracle(record: Record, oracle: Record | None) -> str:
    """The record's own check against the oracle; where that pair is not judged (the
    calibration pair), the relative difference of the two final losses, saying so."""
    if record.framework == ORACLE:
        return "(reference)"
    if record.precision_mode == FLOAT64:  # a twin: its first steps against the oracle's same steps
        curve = oracle_check(record, "math_loss_curve")
        steps = record.timings.total_steps if record.timings else record.calibration.twin_steps if record.calibration else "its"
        return "-" if curve is None or curve.max_rel_error is None else f"{curve.max_rel_error:.2g} (curve, first {steps} steps)"
    check = oracle_check(record, "final_train_loss")
    if check is not None and check.max_rel_error is not None:
        return fmt(check.max_rel_error, ".2g")
    if oracle is None or oracle.metrics is None or record.metrics is None:
        return "-"
    rel = abs(record.metrics.final_loss - oracle.metrics.final_loss) / abs(oracle.metrics.final_loss)
    return f"{rel:.2g} (not judged)" if check else f"{rel:.2g}"


def matrix_of(record: Record) -> Cell:
    """The cell of a record's whole matrix: spec, profile, size and host (every framework,
    device, precision and mode)."""
    return Cell(record.spec.name, record.spec.profile, n_train=record.data.n_train, host=record.host.label)


def oracle_of(record: Record, records: list[Record]) -> Record | None:
    return next((r for r in records if r.framework == ORACLE and matrix_of(r) == matrix_of(record)), None)


def check_counts(record: Record) -> str:
    """`pass / fail / known / skipped`, in bold where a check fails."""
    counts = verdict_counts(c.verdict for c in record.checks)
    text = " / ".join(str(n) for n in counts.values())
    return f"**{text}**" if counts[CheckVerdict.FAIL] else text


def run_to_run(record: Record) -> str:
    """Whether a run's repeats gave the same bits; takes a Record or a runner Outcome."""
    if record.repeats_bitwise_identical is None:
        return "-"
    if record.repeats_bitwise_identical:
        return "bitwise"
    where = "" if record.repeats_first_diff_step is None else f" from step {record.repeats_first_diff_step}"
    return f"differ {fmt(record.repeats_max_abs_diff, '.2g')}{where}"


def status(record: Record) -> str:
    if record.status == "failed":
        return "**FAILED**"
    if record.status == "skipped":
        return "*skipped*"
    failing = verdict_counts(c.verdict for c in record.checks)[CheckVerdict.FAIL]
    return f"**ok, {failing} check{'s' * (failing > 1)} FAIL**" if failing else "ok"


def verdict_rows(records: list[Record], with_host: bool) -> list[list[str]]:
    rows = []
    for r in records:
        row = [r.spec.name, r.framework, r.device.kind, r.precision_mode, r.mode, r.dtype]
        row += [r.host.label] if with_host else []
        row += [
            status(r),
            fmt(r.metrics.final_loss if r.metrics else None, ".6g"),
            accuracy(r),
            horizon_vs_oracle(r),
            final_loss_vs_oracle(r, oracle_of(r, records)),
            check_counts(r),
            run_to_run(r),
        ]
        rows.append(row)
    return rows


def verdict_markdown(records: list[Record]) -> str:
    with_host = len({r.host.label for r in records}) > 1
    header = ["spec", "framework", "device", "precision", "mode", "dtype", *(["host"] * with_host), "status", "final loss"]
    header += ["accuracy", "loss-curve horizon vs oracle", "final loss rel. error vs oracle", "checks pass / fail / known / skip", "run-to-run"]
    return md_table(header, verdict_rows(records, with_host))


# The runs every other is judged against, the first the most: the oracle (on the CPU or the
# GPU), then a port's torch float64 run (where a spec has an oracle, a twin judged against it).
REFERENCES = (ORACLE_LABEL, GPU_ORACLE_KEY.label, PORT_REFERENCE_KEY.label)
PROBLEMS = (CheckVerdict.FAIL, CheckVerdict.KNOWN)


def differing(records: Sequence[Record]) -> set[str]:
    """The runs of one spec that differ from a reference: a check of theirs against one fails
    or is known."""
    return {run_label(r) for r in records for c in r.checks if c.against in REFERENCES and c.verdict in PROBLEMS and run_label(r) not in REFERENCES}


def theirs(record: Record, c: CheckRecord, differ: set[str]) -> bool:
    """Whether a failing or known comparison belongs to the other run's row (issue 55: a slip on
    flax's side read as torch's float64 row failing): the other run differs from a reference
    and this one does not (a reference never does); or this run gates and the other is a
    cell measured, not gated (a float32 run's check against its bf16 cell: that cell's, and
    the float32 row reads no FAIL it does not have)."""
    if c.verdict not in PROBLEMS:
        return False
    measured = run_key(record).precision not in MEASURED and RunKey.from_label(c.against).precision in MEASURED
    return measured or (c.against in differ and run_label(record) not in differ)


def _rank(label: str) -> int:
    """How much a run is the reference of a check: 0 for a run that is none."""
    return len(REFERENCES) - REFERENCES.index(label) if label in REFERENCES else 0


def judges(record: Record, c: CheckRecord, differ: set[str]) -> bool:
    """Whether the record's run is the one a check it carries judges (issue 84), not the one
    it is judged against: the less of a reference of the two (REFERENCES), else the one
    that differs from a reference (`differ`), else either (the pair judged both ways)."""
    mine, other = _rank(run_label(record)), _rank(c.against)
    return mine < other if mine != other else not theirs(record, c, differ)


def problem_checks(records: Iterable[Record]) -> list[tuple[Record, CheckRecord]]:
    """Each failing or known check once (both runs of a pair carry it), with the record of
    the run it judges (judges), whatever the records' order."""
    records = list(records)
    of_spec: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        of_spec.setdefault((r.spec.name, r.host.label), []).append(r)
    differ = {place: differing(mine) for place, mine in of_spec.items()}
    found: dict[tuple, tuple[Record, CheckRecord]] = {}
    for r in records:
        for c in r.checks:
            pair = (r.spec.name, r.host.label, c.name, c.tensor, frozenset((run_label(r), c.against)))
            if c.verdict in PROBLEMS and (pair not in found or not judges(*found[pair], differ[r.spec.name, r.host.label])):
                found[pair] = (r, c)
    return list(found.values())


def gating(record: Record, check: CheckRecord) -> bool:
    """Whether a failing check fails the run (registry.gates, on the record's run and the
    run the check was against): a check over seeds does not, yet (registry.OVER_SEEDS)."""
    return gates(run_key(record), RunKey.from_label(check.against)) and not check.name.startswith(OVER_SEEDS)


def problems_list(records: list[Record]) -> list[str]:
    """One line per run that did not finish, and per failing or known check."""
    lines = []
    for r in records:
        if r.status != "ok":
            lines.append(f"- **{r.status.upper()}** {r.spec.name} {run_label(r)}: {r.reason or 'no reason recorded'}")
    for r, c in problem_checks(records):
        where = "" if c.first_failure_step is None else f", first at step {c.first_failure_step}"
        measured = f"max rel {fmt(c.max_rel_error, '.3g')}{where}; " if c.max_rel_error is not None else ""
        reason = f"; diagnosis: {c.diagnosis}" if c.diagnosis else ""
        lines.append(f"- **{c.verdict.upper()}** {r.spec.name} {run_label(r)} vs {c.against}: {c.name}: {measured}tolerance {c.tolerance}{reason}")
    return lines


def per_step_ms(record: Record | None) -> str:
    if record is None:
        return NOT_RUN
    if record.status != "ok" or record.timings is None:
        return record.status
    return ms(record.timings.per_step_s)


def claim_text(spec_name: str) -> str:
    spec = current_spec(spec_name)
    claim = spec.claims.gpu_speedup if spec else None
    if claim is None:
        return "-"
    return f"{claim.low:g}x" if claim.low == claim.high else f"{claim.low:g}-{claim.high:g}x"


def speedup_text(value: float | None, row: SpeedRow) -> str:
    if value is not None:
        return f"{value:.3g}x"
    return NOT_RUN if row.gpu is None or row.cpu is None else "-"


def over_floor(record: Record | None) -> str:
    """Measured time per step over the hardware floor of that step on that device."""
    if record is None or record.floor is None or record.floor.measured_over_floor is None:
        return "-"
    return f"{record.floor.measured_over_floor:.3g}"


def speed_markdown(rows: list[SpeedRow]) -> str:
    header = ["spec", "framework", "mode", "host", "points", "CPU ms/step", "CPU measured / floor", "GPU ms/step"]
    header += ["GPU measured / floor", "GPU precision", "speedup GPU/CPU", "speedup with transfers", "article claims"]
    body = [
        [
            row.cell.spec,
            row.cell.framework,
            row.cell.mode,
            row.cell.host,
            f"{row.cell.n_train:,}",
            per_step_ms(row.cpu),
            over_floor(row.cpu),
            per_step_ms(row.gpu),
            over_floor(row.gpu),
            row.cell.precision if row.gpu else NOT_RUN,
            speedup_text(row.speedup, row),
            speedup_text(row.speedup_with_transfers, row),
            claim_text(row.cell.spec),
        ]
        for row in rows
    ]
    return md_table(header, body)


def claim_sources(spec_names: Iterable[str]) -> list[str]:
    lines = []
    for name in sorted(set(spec_names)):
        spec = current_spec(name)
        if spec and spec.claims.gpu_speedup:
            lines.append(f"- {name}: {claim_text(name)}, {spec.claims.gpu_speedup.source} (`specs/{name}.yaml`)")
    return lines


def rows_of(rows: list[SpeedRow]) -> list[Record]:
    return [r for row in rows for r in (row.cpu, row.gpu) if r is not None]


def bench_pairs(records: list[Record]) -> dict[Cell, dict[str, Record]]:
    """Each cell across modes -> {mode: record}: eager and fast side by side."""
    cells: dict[Cell, dict[str, Record]] = {}
    for r in sorted(records, key=record_order):
        if r.framework != ORACLE and r.precision_mode != FLOAT64:  # a float64 twin is no speed run
            cell = replace(matrix_of(r), framework=r.framework, device=r.device.kind, precision=r.precision_mode)
            cells.setdefault(cell, {})[r.mode] = r
    return cells


def gating_verdicts(record: Record | None) -> str:
    if record is None:
        return NOT_RUN
    if record.status != "ok":
        return status(record)
    if record.precision_mode != STRICT:
        return "measured, not gated"
    counts = verdict_counts(c.verdict for c in record.checks if gating(record, c))  # not a bf16 or TF32 run's, against it
    fails, known = counts[CheckVerdict.FAIL], counts[CheckVerdict.KNOWN]
    parts = [f"**{fails} FAIL**" if fails else "", f"{known} known" if known else ""]
    return ", ".join(p for p in parts if p) or "ok"


def bench_rows(records: list[Record]) -> list[list[str]]:
    """Eager and fast side by side per spec, size, framework, device and host: the median
    time per step, fast over eager, each against the floor, and the fast run's checks."""
    body = []
    for cell, modes in bench_pairs(records).items():
        eager, fast = modes.get("eager"), modes.get("fast")
        either = fast or eager
        ratio = "-"
        if eager and fast and eager.status == fast.status == "ok":
            ratio = f"{eager.timings.per_step_s / fast.timings.per_step_s:.3g}x"
        step_floor = either.floor
        body.append(
            [
                cell.spec,
                cell.profile,
                f"{cell.n_train:,}",
                cell.framework,
                cell.device if cell.precision == STRICT else f"{cell.device} {cell.precision}",
                cell.host,
                per_step_ms(eager),
                per_step_ms(fast),
                ratio,
                "-" if step_floor is None else ms(step_floor.floor_s),
                "-" if step_floor is None else step_floor.bound,
                over_floor(eager),
                over_floor(fast),
                gating_verdicts(fast),
            ]
        )
    return body


def bench_markdown(records: list[Record]) -> str:
    return md_table(BENCH_HEADER, bench_rows(records))


def floor_inputs(records: list[Record]) -> list[str]:
    """Per spec and device: what the floor is made of, and the rates it was measured with."""
    lines, seen = [], set()
    for r in sorted(records, key=record_order):
        f = r.floor
        key = replace(matrix_of(r), device=r.device.kind, precision=r.precision_mode)
        if f is None or key in seen:
            continue
        seen.add(key)
        launch = "" if f.launch_latency_s is None else f", launches {f.launch_s * 1e6:.3g} us"
        lines.append(
            f"- {r.spec.name} ({r.spec.profile}, {r.data.n_train:,} points) on {r.host.label} {r.device.kind}"
            + ("" if r.precision_mode == STRICT else f" {r.precision_mode}")
            + f": {f.flops_per_step / 1e6:.4g} MFLOP, {f.bytes_per_step / 1e6:.3g} MB fewest "
            f"({f.unfused_bytes_per_step / 1e6:.3g} MB unfused), {f.launches_per_step} launches per step; "
            f"arithmetic {f.compute_s * 1e6:.3g} us, bandwidth {f.memory_s * 1e6:.3g} us{launch}. "
            f"Rates: {f.rates_measured_with}."
        )
    return lines


def curve_pairs(records: list[Record]) -> tuple[list[tuple[Record, Record]], list[tuple[Record, Record]]]:
    """(run, oracle) pairs, and (run, run) pairs: frameworks on one device, and CPU vs GPU of a
    framework. The float64 twins are left out: they run the first steps only, and are judged
    by math parity, not by the float32 envelope these curves are drawn against."""
    ok = [r for r in records if r.status == "ok" and r.artifacts is not None and r.precision_mode != FLOAT64]
    oracles = {r.host.label: r for r in ok if r.framework == ORACLE}
    runs = [r for r in ok if r.framework != ORACLE]
    vs_oracle = [(r, oracles[r.host.label]) for r in runs if r.host.label in oracles]
    between = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a.host.label != b.host.label or a.dtype != b.dtype:
                continue
            same_device = a.device.kind == b.device.kind and a.precision_mode == b.precision_mode
            cpu_gpu = a.framework == b.framework and a.device.kind != b.device.kind
            if same_device or cpu_gpu:
                between.append((a, b))
    return vs_oracle, between


def data_kind(record: Record) -> str | None:
    try:
        return record_spec(record).data.kind
    except Unavailable:
        spec = current_spec(record.spec.name)
        return spec.data.kind if spec else None


def sweep_agreement_table(records: list[Record]) -> str:
    """Per size and run: horizon against the oracle, check counts, and the failing checks."""
    rows = []
    for r in sorted(records, key=record_order):
        failing = sorted({f"{c.name} vs {c.against}" for c in r.checks if c.verdict == CheckVerdict.FAIL})
        rows.append(
            [
                f"{r.data.n_train:,}",
                run_label(r),
                horizon_vs_oracle(r),
                check_counts(r),
                "; ".join(failing) or "-",
            ]
        )
    return md_table(["points", "run", "loss-curve horizon vs oracle", "checks pass / fail / known / skip", "failing checks"], rows)
