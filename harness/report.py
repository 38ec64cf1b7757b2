"""The report: results/REPORT.md and its PNG figures, regenerated from the records alone.

Nothing is trained here. Every number comes from a record or from the .npz beside it
(checked against the sha256 the record names); every spec from the file the record names
(checked against its sha256, else taken from git at the record's commit). The output is
deterministic: sorted rows, no timestamps but the records' own, PNGs without a date, so
the same records give the same bytes. It is written to a temporary folder and moved into
place, so a failed report leaves the previous one whole.

matplotlib is imported only when figures are drawn (harness/figures.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness import spec as spec_mod
from harness.atomic import ensure_replaceable
from harness.errors import HarnessError, RecordError, SpecError
from harness.gitrev import checked_revision
from harness.records import PROJECT_ROOT, Record, read_record
from harness.registry import ORACLE
from harness.speed import SpeedRow, speed_rows

REPORT_NAME = "REPORT.md"
FIGURES_DIR = "figures"
ORACLE_LABEL = "oracle@cpu"
NOT_RUN = "not run"
# Relative differences of exactly 0 cannot be drawn on a log scale: they are drawn here.
DIFF_FLOOR = 1e-10
# Longer loss curves are drawn as the maximum over blocks of steps: 20,000 raw points of a
# curve that touches 0 every other step fill the plot solid.
CURVE_POINTS = 1000
FRAMEWORK_PREFERENCE = ("torch", "jax", "cupy")


class Unavailable(Exception):
    """A figure that cannot be drawn from the records, with the reason the report states."""


# --- records and their artifacts --------------------------------------------------------


def run_label(record: Record) -> str:
    label = f"{record.framework}@{record.device.kind}"
    label = label if record.precision_mode == "strict" else f"{label} {record.precision_mode}"
    return label if record.mode == "eager" else f"{label}:{record.mode}"


def framework_rank(framework: str) -> tuple[int, str]:
    """The order frameworks are listed in: the preferred ones first, the oracle last."""
    if framework == ORACLE:
        return (len(FRAMEWORK_PREFERENCE) + 1, framework)
    if framework in FRAMEWORK_PREFERENCE:
        return (FRAMEWORK_PREFERENCE.index(framework), framework)
    return (len(FRAMEWORK_PREFERENCE), framework)


def record_order(record: Record) -> tuple:
    return (
        record.spec.name,
        record.host.hostname,
        record.data.n_train,
        framework_rank(record.framework),
        record.device.kind,
        record.precision_mode,
        record.mode,
        record.created,
        record.record_id,
    )


def load_records(results_dir: Path) -> dict[str, Record]:
    """Every record under results_dir, by path (relative to it); a folder without any is an error."""
    if not results_dir.is_dir():
        raise HarnessError(f"{results_dir}: no such results folder")
    found = {}
    for path in sorted(results_dir.rglob("*.json")):
        if path.name == "schema.json" or any(part.startswith(".") for part in path.relative_to(results_dir).parts):
            continue
        found[path.relative_to(results_dir).as_posix()] = read_record(path)
    if not found:
        raise HarnessError(f"{results_dir}: no records (*.json) to report on; run `python -m harness run` first")
    return found


def newest_per_cell(records: Iterable[Record]) -> list[Record]:
    """The newest record of each (spec, profile, size, framework, device, precision, mode, dtype, host)."""
    newest: dict[tuple, Record] = {}
    for record in sorted(records, key=lambda r: (r.created, r.record_id)):
        key = (
            record.spec.name,
            record.spec.profile,
            record.data.n_train,
            record.framework,
            record.device.kind,
            record.precision_mode,
            record.mode,
            record.dtype,
            record.host.hostname,
        )
        newest[key] = record
    return sorted(newest.values(), key=record_order)


@dataclass
class Sources:
    """Where the records live, and the artifacts and specs already read from there."""

    results_dir: Path
    paths: dict[str, Path] = field(default_factory=dict)  # record_id -> its .json
    read: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # record_id -> its artifact

    @classmethod
    def scan(cls, results_dir: Path) -> tuple[Sources, list[Record]]:
        found = load_records(results_dir)
        sources = cls(results_dir, {r.record_id: results_dir / rel for rel, r in found.items()})
        return sources, list(found.values())

    def artifact(self, record: Record) -> dict[str, np.ndarray]:
        """The .npz beside a record, after checking its sha256."""
        if record.record_id not in self.read:
            self.read[record.record_id] = self._read_artifact(record)
        return self.read[record.record_id]

    def _read_artifact(self, record: Record) -> dict[str, np.ndarray]:
        if record.artifacts is None:
            raise Unavailable(f"{run_label(record)} ({record.record_id}) has no artifact ({record.status})")
        path = self.paths[record.record_id].with_name(record.artifacts.file)
        try:
            payload = path.read_bytes()
        except OSError as exc:
            raise Unavailable(f"{path.name}: cannot read: {exc.strerror or exc}") from None
        if hashlib.sha256(payload).hexdigest() != record.artifacts.sha256:
            raise Unavailable(f"{path.name}: sha256 differs from the record's; artifact not used")
        with np.load(io.BytesIO(payload)) as npz:
            return {key: npz[key] for key in npz.files}

    def losses(self, record: Record) -> np.ndarray:
        return np.asarray(self.artifact(record)["losses"], dtype=np.float64)


def final_params(arrays: dict[str, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) per layer from an artifact, W stored (fan_in, fan_out)."""
    params = []
    while f"W{len(params)}" in arrays:
        i = len(params)
        params.append((arrays[f"W{i}"].astype(np.float64), arrays[f"b{i}"].astype(np.float64)))
    if not params:
        raise Unavailable("the artifact holds no final parameters")
    return params


# --- the spec a record was run with -----------------------------------------------------


@cache
def _spec_text_at(commit: str, repo_path: str) -> bytes | None:
    try:
        show = ["git", "show", "--end-of-options", f"{commit}:{repo_path}"]
        done = subprocess.run(show, cwd=PROJECT_ROOT, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _spec_candidates(path: str, commit: str | None) -> Iterable[tuple[str, bytes | None]]:
    """(where, bytes) of the spec file a record names: its path, then the same name under
    specs/, then that file in git at the record's commit."""
    named = Path(path)
    local = named if named.is_absolute() else PROJECT_ROOT / named
    for candidate in dict.fromkeys([local, spec_mod.SPECS_DIR / named.name]):
        yield str(candidate), candidate.read_bytes() if candidate.is_file() else None
    if commit:
        repo_path = f"specs/{named.name}"
        yield f"git {commit[:10]}:{repo_path}", _spec_text_at(commit, repo_path)


def record_spec(record: Record) -> spec_mod.Spec:
    """The spec as the record ran it (its profile's and sweep point's overrides applied)."""
    overrides = json.dumps(record.spec.overrides, sort_keys=True)
    commit = record.git.commit and checked_revision(record.git.commit, f"record {record.record_id}: git.commit")
    return _record_spec(record.spec.path, record.spec.sha256, commit, overrides)


@cache
def _record_spec(path: str, sha256: str, commit: str | None, overrides_json: str) -> spec_mod.Spec:
    for where, raw in _spec_candidates(path, commit):
        if raw is None or hashlib.sha256(raw).hexdigest() != sha256:
            continue
        try:
            doc = spec_mod.parse_document(Path(where), raw.decode("utf-8"))
            extra = json.loads(overrides_json) or None
            spec, _ = spec_mod.validate_document(Path(where), doc, spec_mod.FULL_PROFILE, extra)
        except (SpecError, UnicodeDecodeError) as exc:
            raise Unavailable(f"{where}: the spec no longer validates: {exc}") from None
        return spec
    raise Unavailable(f"the spec file {path} with sha256 {sha256[:12]}... is neither on disk nor in git")


@cache
def current_spec(name: str, specs_dir: Path = spec_mod.SPECS_DIR) -> spec_mod.Spec | None:
    """The spec file of that name in specs/ today (for its claims and its sweep)."""
    path = specs_dir / f"{name}.yaml"
    if not path.is_file():
        return None
    try:
        return spec_mod.load_spec(path).spec
    except SpecError:
        return None


# --- formatting -------------------------------------------------------------------------


def fmt(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def provenance(records: Iterable[Record]) -> str:
    """Which records a table or figure comes from: count, hosts, commits, run ids."""
    records = list(records)
    hosts = sorted({r.host.hostname for r in records})
    commits = sorted({(r.git.commit or "unknown")[:10] + ("+dirty" if r.git.dirty else "") for r in records})
    runs = sorted({r.run_id for r in records})
    return (
        f"{len(records)} record{'s' * (len(records) != 1)}; host {', '.join(hosts)}; "
        f"commit {', '.join(commits)}; run {', '.join(runs)}"
    )


# --- the verdict table ------------------------------------------------------------------


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
    check = oracle_check(record, "final_train_loss")
    if check is not None and check.max_rel_error is not None:
        return fmt(check.max_rel_error, ".2g")
    if oracle is None or oracle.metrics is None or record.metrics is None:
        return "-"
    rel = abs(record.metrics.final_loss - oracle.metrics.final_loss) / abs(oracle.metrics.final_loss)
    return f"{rel:.2g} (not judged)" if check else f"{rel:.2g}"


def oracle_of(record: Record, records: list[Record]) -> Record | None:
    return next(
        (
            r
            for r in records
            if r.framework == ORACLE
            and (r.spec.name, r.spec.profile, r.data.n_train, r.host.hostname)
            == (record.spec.name, record.spec.profile, record.data.n_train, record.host.hostname)
        ),
        None,
    )


def verdict_counts(record: Record) -> str:
    counts = {v: sum(c.verdict == v for c in record.checks) for v in ("pass", "fail", "known", "skipped")}
    text = " / ".join(str(n) for n in counts.values())
    return f"**{text}**" if counts["fail"] else text


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
    failing = sum(c.verdict == "fail" for c in record.checks)
    return f"**ok, {failing} check{'s' * (failing > 1)} FAIL**" if failing else "ok"


def verdict_rows(records: list[Record], with_host: bool) -> list[list[str]]:
    rows = []
    for r in records:
        row = [r.spec.name, r.framework, r.device.kind, r.precision_mode, r.mode, r.dtype]
        row += [r.host.hostname] if with_host else []
        row += [
            status(r),
            fmt(r.metrics.final_loss if r.metrics else None, ".6g"),
            accuracy(r),
            horizon_vs_oracle(r),
            final_loss_vs_oracle(r, oracle_of(r, records)),
            verdict_counts(r),
            run_to_run(r),
        ]
        rows.append(row)
    return rows


def verdict_table(records: list[Record]) -> str:
    with_host = len({r.host.hostname for r in records}) > 1
    header = ["spec", "framework", "device", "precision", "mode", "dtype", *(["host"] * with_host), "status", "final loss"]
    header += ["accuracy", "loss-curve horizon vs oracle", "final loss rel. error vs oracle", "checks pass / fail / known / skip", "run-to-run"]
    return md_table(header, verdict_rows(records, with_host))


def problems_list(records: list[Record]) -> list[str]:
    """One line per run that did not finish, and per failing or known check."""
    lines = []
    for r in records:
        if r.status != "ok":
            lines.append(f"- **{r.status.upper()}** {r.spec.name} {run_label(r)}: {r.reason or 'no reason recorded'}")
    seen = set()
    for r in records:
        for c in r.checks:
            pair = (r.spec.name, r.host.hostname, c.name, frozenset((run_label(r), c.against)))
            if c.verdict in ("fail", "known") and pair not in seen:
                seen.add(pair)
                where = "" if c.first_failure_step is None else f", first at step {c.first_failure_step}"
                measured = f"max rel {fmt(c.max_rel_error, '.3g')}{where}; " if c.max_rel_error is not None else ""
                reason = f"; diagnosis: {c.diagnosis}" if c.diagnosis else ""
                lines.append(
                    f"- **{c.verdict.upper()}** {r.spec.name} {run_label(r)} vs {c.against}: {c.name}: "
                    f"{measured}tolerance {c.tolerance}{reason}"
                )
    return lines


# --- speed ------------------------------------------------------------------------------


def per_step_ms(record: Record | None) -> str:
    if record is None:
        return NOT_RUN
    if record.status != "ok" or record.timings is None:
        return record.status
    return f"{record.timings.per_step_s * 1e3:.3g}"


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


def speed_table(rows: list[SpeedRow]) -> str:
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
            row.cell.precision_mode if row.gpu else NOT_RUN,
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


# --- building the document --------------------------------------------------------------


@dataclass
class Document:
    """REPORT.md as it is assembled, and the figures it references (name -> PNG bytes)."""

    lines: list[str] = field(default_factory=list)
    figures: dict[str, bytes] = field(default_factory=dict)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, name: str, caption: str, draw: Callable[[], Any], render: Callable[[Any], bytes]) -> None:
        """Draw a figure and reference it with its caption, or state why it is missing."""
        number = len(self.figures) + 1
        try:
            png = render(draw())
        except Unavailable as exc:
            self.add(f"*Not drawn ({name}): {exc}*", "")
            return
        self.figures[f"{name}.png"] = png
        alt = caption.split(". ")[0]
        self.add(f"![{alt}]({FIGURES_DIR}/{name}.png)", "", f"*Figure {number}. {caption}*", "")


def by_spec(records: Iterable[Record]) -> dict[str, list[Record]]:
    grouped: dict[str, list[Record]] = {}
    for r in sorted(records, key=record_order):
        grouped.setdefault(r.spec.name, []).append(r)
    return grouped


def sweep_records(records: list[Record]) -> dict[str, list[Record]]:
    """Per spec with a sweep (in specs/ today): its records of the sweep profile."""
    found = {}
    for name, mine in by_spec(records).items():
        spec = current_spec(name)
        if spec is not None and spec.sweep is not None:
            chosen = [r for r in mine if r.spec.profile == spec.sweep.profile]
            if chosen:
                found[name] = chosen
    return found


def build(results_dir: Path, profile: str = spec_mod.FULL_PROFILE) -> Document:
    """The whole report, in memory."""
    from harness import figures

    sources, every = Sources.scan(results_dir)
    latest = newest_per_cell(every)
    main = [r for r in latest if r.spec.profile == profile]
    doc = Document()
    doc.add("# Reproducibility report", "")
    doc.add(
        f"Generated by `python -m harness report` from the records in `{results_dir.name}/` "
        f"({len(every)} records in all; the newest of each cell is used). "
        f"Main sections: profile `{profile}`; the crossover sweep: each spec's sweep profile. "
        "Nothing was trained to make this report.",
        "",
    )
    verdict_section(doc, main, profile)
    speed_section(doc, main, profile, figures)
    benched = {r.spec.profile for r in latest if r.mode != "eager"}
    bench_section(doc, [r for r in latest if r.spec.profile in benched], figures)
    divergence_section(doc, main, sources, figures)
    article_section(doc, main, sources, figures)
    sweep_section(doc, latest, figures)
    return doc


def verdict_section(doc: Document, records: list[Record], profile: str) -> None:
    doc.add("## Verdicts", "")
    if not records:
        doc.add(f"No records of profile `{profile}`.", "")
        return
    doc.add(
        f"From {provenance(records)}. Errors are relative, against the float64 oracle (`oracle@cpu`): "
        "the horizon is how many steps the loss curve stays within the spec's `loss_curve.rtol`. "
        "Checks count every pairwise verdict the run takes part in. Run-to-run compares the "
        "timing repeats of one run.",
        "",
        verdict_table(records),
        "",
    )
    problems = problems_list(records)
    doc.add("Failed and skipped runs, failing and known checks:", "", *(problems or ["- none"]), "")


def speed_section(doc: Document, records: list[Record], profile: str, figures) -> None:
    doc.add("## Speed", "")
    rows = speed_rows(records)
    if not rows:
        doc.add(f"No timed records of profile `{profile}`.", "")
        return
    doc.add(
        f"Median training time per step (device synchronised; transfers and warm-up apart) from "
        f"{provenance(rows_of(rows))}. Speedup is CPU time over GPU time, for the same spec, "
        f"size, framework and host; \"with transfers\" adds each side's copy of the data to its "
        f"device. \"{NOT_RUN}\": no record of that device.",
        "",
        speed_table(rows),
        "",
        "The articles' claims:",
        "",
        *claim_sources(row.cell.spec for row in rows),
        "",
    )
    gpu_note = "" if any(row.gpu for row in rows) else f" No GPU records: every GPU bar is marked \"{NOT_RUN}\"."
    doc.figure(
        "speed_per_step",
        f"Training time per step (ms, log scale) per spec, framework and device.{gpu_note} "
        f"From {provenance(rows_of(rows))}.",
        lambda: figures.time_per_step_bars(rows),
        figures.png,
    )
    claims = {name: current_spec(name).claims.gpu_speedup for name in {row.cell.spec for row in rows} if current_spec(name)}
    doc.figure(
        "speedup",
        "GPU-over-CPU speedup per spec and framework, without and with transfers (log scale), "
        f"beside the article's claim (shaded band or line).{gpu_note} From {provenance(rows_of(rows))}.",
        lambda: figures.speedup_bars(rows, claims),
        figures.png,
    )


def bench_pairs(records: list[Record]) -> dict[tuple, dict[str, Record]]:
    """(spec, profile, size, framework, device, precision, host) -> {mode: record}: eager
    and fast side by side."""
    cells: dict[tuple, dict[str, Record]] = {}
    for r in sorted(records, key=record_order):
        if r.framework != ORACLE and r.precision_mode != "float64":  # a float64 twin is no speed run
            cell = (r.spec.name, r.spec.profile, r.data.n_train, r.framework, r.device.kind, r.precision_mode, r.host.hostname)
            cells.setdefault(cell, {})[r.mode] = r
    return cells


def gating_verdicts(record: Record | None) -> str:
    if record is None:
        return NOT_RUN
    if record.status != "ok":
        return status(record)
    if record.precision_mode != "strict":
        return "measured, not gated"
    fails = sum(c.verdict == "fail" for c in record.checks)
    known = sum(c.verdict == "known" for c in record.checks)
    parts = [f"**{fails} FAIL**" if fails else "", f"{known} known" if known else ""]
    return ", ".join(p for p in parts if p) or "ok"


BENCH_HEADER = [
    *("spec", "profile", "points", "framework", "device", "host", "eager ms/step", "fast ms/step", "fast/eager"),
    *("floor ms/step", "bound", "eager / floor", "fast / floor", "fast mode's checks"),
]


def bench_rows(records: list[Record]) -> list[list[str]]:
    """Eager and fast side by side per spec, size, framework, device and host: the median
    time per step, fast over eager, each against the floor, and the fast run's checks."""
    body = []
    for (spec_name, profile, n_train, framework, device, precision, host), modes in bench_pairs(records).items():
        eager, fast = modes.get("eager"), modes.get("fast")
        either = fast or eager
        ratio = "-"
        if eager and fast and eager.status == fast.status == "ok":
            ratio = f"{eager.timings.per_step_s / fast.timings.per_step_s:.3g}x"
        step_floor = either.floor
        body.append(
            [
                spec_name,
                profile,
                f"{n_train:,}",
                framework,
                device if precision == "strict" else f"{device} {precision}",
                host,
                per_step_ms(eager),
                per_step_ms(fast),
                ratio,
                "-" if step_floor is None else f"{step_floor.floor_s * 1e3:.3g}",
                "-" if step_floor is None else step_floor.bound,
                over_floor(eager),
                over_floor(fast),
                gating_verdicts(fast),
            ]
        )
    return body


def bench_table(records: list[Record]) -> str:
    return md_table(BENCH_HEADER, bench_rows(records))


def floor_inputs(records: list[Record]) -> list[str]:
    """Per spec and device: what the floor is made of, and the rates it was measured with."""
    lines, seen = [], set()
    for r in sorted(records, key=record_order):
        f = r.floor
        key = (r.spec.name, r.spec.profile, r.data.n_train, r.device.kind, r.precision_mode, r.host.hostname)
        if f is None or key in seen:
            continue
        seen.add(key)
        launch = "" if f.launch_latency_s is None else f", launches {f.launch_s * 1e6:.3g} us"
        lines.append(
            f"- {r.spec.name} ({r.spec.profile}, {r.data.n_train:,} points) on {r.host.hostname} {r.device.kind}"
            + ("" if r.precision_mode == "strict" else f" {r.precision_mode}")
            + f": {f.flops_per_step / 1e6:.4g} MFLOP, {f.bytes_per_step / 1e6:.3g} MB fewest "
            f"({f.unfused_bytes_per_step / 1e6:.3g} MB unfused), {f.launches_per_step} launches per step; "
            f"arithmetic {f.compute_s * 1e6:.3g} us, bandwidth {f.memory_s * 1e6:.3g} us{launch}. "
            f"Rates: {f.rates_measured_with}."
        )
    return lines


def bench_section(doc: Document, records: list[Record], figures) -> None:
    doc.add("## Fast modes and the hardware floor", "")
    if not records:
        doc.add("No fast-mode records (`python -m harness bench`).", "")
        return
    doc.add(
        f"`python -m harness bench` runs each framework's eager (article-style) and fast (compiled) "
        f"mode side by side (by default profile `{spec_mod.BENCH_PROFILE}`); every profile with "
        f"fast-mode records is listed, from {provenance(records)}. "
        "The floor is the lowest time per step the device allows (`harness/floor.py`): the "
        "largest of the step's floating-point operations at the measured matrix-product rate, "
        "its fewest bytes at the measured bandwidth and, on a GPU, its fewest kernel launches "
        "at the measured launch latency; \"bound\" names that term. The fast mode's checks "
        "are the same agreement checks the eager mode takes, against the float64 oracle and "
        "every other run.",
        "",
        bench_table(records),
        "",
        "What each floor is made of:",
        "",
        *floor_inputs(records),
        "",
    )
    doc.figure(
        "measured_over_floor",
        f"Measured time per step over the floor, per spec, framework, device and mode (log scale; "
        f"1 is the floor). From {provenance(records)}.",
        lambda: figures.floor_bars(records),
        figures.png,
    )


def curve_pairs(records: list[Record]) -> tuple[list[tuple[Record, Record]], list[tuple[Record, Record]]]:
    """(run, oracle) pairs, and (run, run) pairs: frameworks on one device, and CPU vs GPU of a framework."""
    ok = [r for r in records if r.status == "ok" and r.artifacts is not None]
    oracles = {r.host.hostname: r for r in ok if r.framework == ORACLE}
    runs = [r for r in ok if r.framework != ORACLE]
    vs_oracle = [(r, oracles[r.host.hostname]) for r in runs if r.host.hostname in oracles]
    between = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a.host.hostname != b.host.hostname or a.dtype != b.dtype:
                continue
            same_device = a.device.kind == b.device.kind and a.precision_mode == b.precision_mode
            cpu_gpu = a.framework == b.framework and a.device.kind != b.device.kind
            if same_device or cpu_gpu:
                between.append((a, b))
    return vs_oracle, between


def divergence_section(doc: Document, records: list[Record], sources: Sources, figures) -> None:
    doc.add("## Divergence of the loss curves", "")
    doc.add(
        "Relative difference |a - b| / |b| of the full loss curves (from each record's .npz, "
        "sha256 checked), step by step, on a log scale. The dashed line is the spec's "
        f"`loss_curve.rtol`. Differences of exactly 0 (bitwise-equal losses) are drawn at the floor {DIFF_FLOOR:g}. "
        f"Curves longer than {CURVE_POINTS:,} steps are drawn as the maximum over consecutive blocks of steps.",
        "",
    )
    for name, mine in by_spec(records).items():
        vs_oracle, between = curve_pairs(mine)
        if not vs_oracle and not between:
            doc.add(f"*{name}: fewer than two finished runs, no curves to compare.*", "")
            continue
        used = sorted({r.record_id: r for pair in vs_oracle + between for r in pair}.values(), key=record_order)
        doc.figure(
            f"divergence_{name}",
            f"{name}: relative loss difference per training step, each run against the float64 oracle "
            f"(left) and between runs (right), with the envelope that judges every pair (solid black) and the "
            f"spec's horizon rule (dashed). From {provenance(used)}.",
            lambda mine=mine, vs_oracle=vs_oracle, between=between: figures.divergence(
                mine[0].spec.name, vs_oracle, between, sources, horizon_rtol(mine[0]), DIFF_FLOOR, envelope_of(vs_oracle + between, sources)
            ),
            figures.png,
        )


def horizon_rtol(record: Record) -> float | None:
    """The spec's own loss_curve.rtol (its horizon rule), if it states one."""
    rule = record_spec(record).checks.loss_curve
    return None if rule is None else rule.rtol


def envelope_of(pairs: list[tuple[Record, Record]], sources: Sources) -> np.ndarray | None:
    """The envelope that judged these curves, as the first float32 run's artifact keeps it
    (records written before it was kept have none: the figure then shows no envelope)."""
    for record in (r for pair in pairs for r in pair if r.dtype == "float32"):
        try:
            arrays = sources.artifact(record)
        except Unavailable:
            continue
        if "envelope" in arrays:
            return np.asarray(arrays["envelope"], dtype=np.float64)
    return None


def peaks_panels(records: list[Record]) -> tuple[Record, Record, str]:
    """The two trained nets to draw: a framework's CPU and GPU runs, else two frameworks' CPU runs."""
    ok = [r for r in records if r.status == "ok" and r.artifacts is not None and r.framework != ORACLE]
    ok.sort(key=record_order)
    for cpu in (r for r in ok if r.device.kind == "cpu"):
        gpu = next((r for r in ok if r.device.kind == "gpu" and r.framework == cpu.framework and r.host.hostname == cpu.host.hostname), None)
        if gpu is not None:
            return cpu, gpu, "the CPU-trained and the GPU-trained net of one framework, as in the article"
    cpus = [r for r in ok if r.device.kind == "cpu"]
    if len(cpus) >= 2:
        why = f"no GPU records: the CPU-trained nets of two frameworks ({cpus[0].framework}, {cpus[1].framework}) instead of CPU and GPU"
        return cpus[0], cpus[1], why
    raise Unavailable("fewer than two finished peaks runs with final parameters")


def article_section(doc: Document, records: list[Record], sources: Sources, figures) -> None:
    doc.add("## The articles' figures, from our runs", "")
    grouped = by_spec(records)
    drawn = False
    for name, mine in grouped.items():
        kind = data_kind(mine[0])
        if kind == "peaks_grid":
            drawn = True
            try:
                a, b, note = peaks_panels(mine)
            except Unavailable as exc:
                doc.add(f"*Not drawn (peaks_{name}): {exc}*", "")
                continue
            doc.figure(
                f"peaks_{name}",
                f"{name}: the training data (the peaks function on a 40x40 grid over the spec's range) "
                f"and the final net outputs on that grid: {note}. From {provenance([a, b])}.",
                lambda a=a, b=b: figures.peaks_surfaces(a, b, sources),
                figures.png,
            )
        elif kind == "moons":
            drawn = True
            shown = [r for r in mine if r.status == "ok" and r.artifacts is not None]
            doc.figure(
                f"moons_{name}",
                f"{name}: decision boundary (predicted class on a mesh of step 0.01) of each run's final "
                f"net, one panel per framework and device, with the training points on top. From {provenance(shown)}.",
                lambda shown=shown: figures.moons_boundaries(shown, sources),
                figures.png,
            )
    if not drawn:
        doc.add("No records of a spec with an article figure (peaks, moons).", "")


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
        failing = sorted({f"{c.name} vs {c.against}" for c in r.checks if c.verdict == "fail"})
        rows.append(
            [
                f"{r.data.n_train:,}",
                run_label(r),
                horizon_vs_oracle(r),
                verdict_counts(r),
                "; ".join(failing) or "-",
            ]
        )
    return md_table(["points", "run", "loss-curve horizon vs oracle", "checks pass / fail / known / skip", "failing checks"], rows)


def sweep_section(doc: Document, latest: list[Record], figures) -> None:
    doc.add("## Crossover sweep", "")
    sweeps = sweep_records(latest)
    if not sweeps:
        doc.add("No sweep records (`harness sweep` writes them, one per data size).", "")
        return
    for name, mine in sweeps.items():
        rows = speed_rows(mine)
        has_gpu = any(row.gpu for row in rows)
        doc.add(f"### {name}", "", speed_table(rows), "")
        what = (
            "speedup GPU/CPU (right)"
            if has_gpu
            else f"speedup {NOT_RUN}: there are no GPU records, so the right panel is empty"
        )
        doc.add(
            "Agreement at each size (the same checks, tolerances and known differences as the full "
            "runs; failing checks by name, `against` the other run; the README's findings explain "
            "them, with evidence in `tests/test_findings.py`):",
            "",
            sweep_agreement_table(mine),
            "",
        )
        doc.figure(
            f"sweep_{name}",
            f"{name}, profile `{mine[0].spec.profile}`: training time per step (ms) against the number of "
            f"training points (log-log, left), and {what}. From {provenance(rows_of(rows))}.",
            lambda name=name, rows=rows: figures.sweep(name, rows, current_spec(name).claims.gpu_speedup),
            figures.png,
        )


# --- writing ----------------------------------------------------------------------------


def write(doc: Document, out: Path) -> None:
    """Write REPORT.md and figures/ under out's folder: first to a temporary folder, then
    moved into place (the figures first, REPORT.md last)."""
    folder = out.parent
    ensure_replaceable(out)  # a FIFO or a device is refused, not replaced by a file
    if (folder / FIGURES_DIR).is_symlink() or ((folder / FIGURES_DIR).exists() and not (folder / FIGURES_DIR).is_dir()):
        raise HarnessError(f"{folder / FIGURES_DIR}: not a folder; refusing to replace it")
    staging = folder / f".report-{uuid.uuid4().hex}"
    try:
        (staging / FIGURES_DIR).mkdir(parents=True)
        for name, payload in doc.figures.items():
            (staging / FIGURES_DIR / name).write_bytes(payload)
        (staging / out.name).write_text("\n".join(doc.lines).rstrip() + "\n")
        figures_dir = folder / FIGURES_DIR
        retired = folder / f".report-old-{uuid.uuid4().hex}"
        if figures_dir.exists():
            figures_dir.rename(retired)
        (staging / FIGURES_DIR).rename(figures_dir)
        os.replace(staging / out.name, out)
        shutil.rmtree(retired, ignore_errors=True)
    except OSError as exc:
        raise RecordError(f"{out}: cannot write the report: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def report(results_dir: Path, out: Path | None = None, profile: str = spec_mod.FULL_PROFILE) -> tuple[Path, Document]:
    out = out or results_dir / REPORT_NAME
    doc = build(results_dir, profile)
    write(doc, out)
    return out, doc
