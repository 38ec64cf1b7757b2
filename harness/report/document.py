"""The report: results/REPORT.md and its PNG figures, regenerated from the records alone.

Nothing is trained here. Every number comes from a record or from the .npz beside it
(checked against the sha256 the record names); every spec from the file the record names
(checked against its sha256, else taken from git at the record's commit). The output is
deterministic: sorted rows, no timestamps but the records' own, PNGs without a date, so
the same records give the same bytes. It is written to a temporary folder and moved into
place, so a failed report leaves the previous one whole.

matplotlib is imported only when figures are drawn (harness/report/figures.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.atomic import atomic_write, ensure_replaceable
from harness.core.errors import HarnessError
from harness.core.registry import EAGER, FLOAT32, ORACLE, STRICT
from harness.records.schema import Record
from harness.records.store import Sources, Unavailable, current_spec, newest_per_cell, record_order, record_spec
from harness.report.rows import (
    CURVE_POINTS,
    NOT_RUN,
    bench_markdown,
    claim_sources,
    curve_pairs,
    data_kind,
    floor_inputs,
    problems_list,
    provenance,
    rows_of,
    speed_markdown,
    sweep_agreement_table,
    verdict_markdown,
)
from harness.report.speed import speed_rows
from harness.spec import model as spec_mod

REPORT_NAME = "REPORT.md"
FIGURES_DIR = "figures"
WRITTEN = ".written-by-harness"  # in figures/: the figures the last report wrote, one name a line
FIGURE_NAME = re.compile(r"[a-z0-9_]+\.png")
# Relative differences of exactly 0 cannot be drawn on a log scale: they are drawn here.
DIFF_CLIP = 1e-10


# --- building the document --------------------------------------------------------------


@dataclass
class Document:
    """REPORT.md as it is assembled, and the figures it references (name -> PNG bytes)."""

    profile: str = spec_mod.FULL_PROFILE  # of the main tables
    lines: list[str] = field(default_factory=list)
    figures: dict[str, bytes] = field(default_factory=dict)
    others: dict[str, int] = field(default_factory=dict)  # the records of profiles not in the main tables, by profile

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def figure(self, name: str, caption: str, draw: Callable[[], Any], render: Callable[[Any], bytes]) -> None:
        """Draw a figure and reference it with its caption, or state why it is missing."""
        if not FIGURE_NAME.fullmatch(f"{name}.png"):
            raise HarnessError(f"figure {name!r}: not a figure's name ({FIGURE_NAME.pattern}); refusing to write it")
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


def table_profiles(records: list[Record]) -> list[str]:
    """The profiles the records hold that the main tables can show: all but a sweep's and
    the bench's, which have sections of their own."""
    swept = {r.spec.profile for mine in sweep_records(records).values() for r in mine}
    return sorted({r.spec.profile for r in records} - swept - {spec_mod.BENCH_PROFILE})


def main_profile(records: list[Record], asked: str | None) -> str:
    """The profile of the report's main tables: the one asked for, else full, else the one
    profile the records hold (a sweep's and the bench's own profiles aside, which have
    sections of their own); a HarnessError naming what the records hold where the main
    tables would be empty for want of a profile they do hold."""
    held = sorted({r.spec.profile for r in records})
    main = table_profiles(records)
    if asked is None and len(main) == 1 and spec_mod.FULL_PROFILE not in held:
        return main[0]
    chosen = asked or spec_mod.FULL_PROFILE
    if chosen in held or not main:  # no main profile held: a sweep's or a bench's records alone
        return chosen
    raise HarnessError(f"--profile {chosen}: the records hold profiles {', '.join(held)}; name one with --profile")


def build(results_dir: Path, profile: str | None = None) -> Document:
    """The whole report, in memory."""
    try:
        from harness.report import figures
    except ImportError as exc:
        raise HarnessError(f"report: its figures need matplotlib, which this Python lacks ({exc.name}): pip install '.[report]'") from None

    sources, every = Sources.scan(results_dir)
    latest = newest_per_cell(every)
    profile = main_profile(latest, profile)
    main = [r for r in latest if r.spec.profile == profile]
    doc = Document(profile=profile)
    left_out = set(table_profiles(latest)) - {profile}  # said where the report is written
    for r in latest:
        if r.spec.profile in left_out:
            doc.others[r.spec.profile] = doc.others.get(r.spec.profile, 0) + 1
    doc.add("# Reproducibility report", "")
    doc.add(
        f"Generated by `python -m harness report` from the records in `{results_dir.name}/` "
        f"({len(every)} records in all; the newest of each cell is used). "
        f"Main sections: profile `{profile}`; the crossover sweep: each spec's sweep profile. "
        "Nothing was trained to make this report.",
        "",
    )
    if doc.others:  # the records a reader of the main tables does not see: said, not dropped
        held = "; ".join(f"{count} of profile `{p}` (`--profile {p}` reports them)" for p, count in sorted(doc.others.items()))
        doc.add(f"Records left out of the main tables: {held}.", "")
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
        verdict_markdown(records),
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
        f'size, framework and host; "with transfers" adds each side\'s copy of the data to its '
        f'device. "{NOT_RUN}": no record of that device.',
        "",
        speed_markdown(rows),
        "",
        "The articles' claims:",
        "",
        *claim_sources(row.cell.spec for row in rows),
        "",
    )
    gpu_note = "" if any(row.gpu for row in rows) else f' No GPU records: every GPU bar is marked "{NOT_RUN}".'
    doc.figure(
        "speed_per_step",
        f"Training time per step (ms, log scale) per spec, framework and device.{gpu_note} From {provenance(rows_of(rows))}.",
        lambda: figures.time_per_step_bars(rows),
        figures.png,
    )
    # the speedups where there are some: the rows of a host and spec with GPU records
    paired = [row for row in rows if row.gpu is not None] or rows
    unpaired = sorted({row.cell.spec for row in rows} - {row.cell.spec for row in paired})
    elsewhere = f" Not yet run on a GPU: {', '.join(unpaired)}." if unpaired else ""
    claims = {name: current_spec(name).claims.gpu_speedup for name in {row.cell.spec for row in paired} if current_spec(name)}
    doc.figure(
        "speedup",
        "GPU-over-CPU speedup per spec and framework, without and with transfers (log scale), "
        f"beside the article's claim (shaded band or line).{gpu_note}{elsewhere} From {provenance(rows_of(paired))}.",
        lambda: figures.speedup_bars(paired, claims),
        figures.png,
    )


def bench_section(doc: Document, records: list[Record], figures) -> None:
    doc.add("## Fast modes and the hardware floor", "")
    if not records:
        doc.add("No fast-mode records (`python -m harness bench`).", "")
        return
    doc.add(
        f"`python -m harness bench` runs each framework's eager (article-style) and fast (compiled) "
        f"mode side by side (by default profile `{spec_mod.BENCH_PROFILE}`); every profile with "
        f"fast-mode records is listed, from {provenance(records)}. "
        "The floor is the lowest time per step the device allows (`harness/hardware/floor.py`): the "
        "largest of the step's floating-point operations at the measured matrix-product rate, "
        "its fewest bytes at the measured bandwidth and, on a GPU, its fewest kernel launches "
        'at the measured launch latency; "bound" names that term. The fast mode\'s checks '
        "are the same agreement checks the eager mode takes, against the float64 oracle and "
        "every other run.",
        "",
        bench_markdown(records),
        "",
        "What each floor is made of:",
        "",
        *floor_inputs(records),
        "",
    )
    doc.figure(
        "measured_over_floor",
        f"Measured time per step over the floor, per spec, framework, device and mode (log scale; 1 is the floor). From {provenance(records)}.",
        lambda: figures.floor_bars(records),
        figures.png,
    )


def divergence_section(doc: Document, records: list[Record], sources: Sources, figures) -> None:
    doc.add("## Divergence of the loss curves", "")
    doc.add(
        "Relative difference |a - b| / |b| of the full loss curves (from each record's .npz, "
        "sha256 checked), step by step, on a log scale. The dashed line is the spec's "
        f"`loss_curve.rtol`. Differences of exactly 0 (bitwise-equal losses) are drawn at {DIFF_CLIP:g}. "
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
                mine[0].spec.name, vs_oracle, between, sources, horizon_rtol(mine[0]), DIFF_CLIP, envelope_of(vs_oracle + between, sources)
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
    for record in (r for pair in pairs for r in pair if r.dtype == FLOAT32):
        try:
            arrays = sources.artifact(record)
        except Unavailable:
            continue
        if "envelope" in arrays:
            return np.asarray(arrays["envelope"], dtype=np.float64)
    return None


def peaks_panels(records: list[Record]) -> tuple[Record, Record, str]:
    """The two trained nets to draw: a framework's CPU and GPU runs, else two frameworks' CPU
    runs; whole float32 trainings only (a float64 twin trains the first steps alone)."""
    ok = [
        r
        for r in records
        if r.status == "ok" and r.artifacts is not None and r.framework != ORACLE and r.precision_mode == STRICT and r.mode == EAGER
    ]
    ok.sort(key=record_order)
    for cpu in (r for r in ok if r.device.kind == "cpu"):
        gpu = next((r for r in ok if r.device.kind == "gpu" and r.framework == cpu.framework and r.host.label == cpu.host.label), None)
        if gpu is not None:
            return cpu, gpu, "the CPU-trained and the GPU-trained net of one framework, as in the article"
    cpus = []  # the first CPU run of each framework
    for r in ok:
        if r.device.kind == "cpu" and r.framework not in {c.framework for c in cpus}:
            cpus.append(r)
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


def sweep_section(doc: Document, latest: list[Record], figures) -> None:
    doc.add("## Crossover sweep", "")
    sweeps = sweep_records(latest)
    if not sweeps:
        doc.add("No sweep records (`harness sweep` writes them, one per data size).", "")
        return
    for name, mine in sweeps.items():
        rows = speed_rows(mine)
        has_gpu = any(row.gpu for row in rows)
        doc.add(f"### {name}", "", speed_markdown(rows), "")
        what = "speedup GPU/CPU (right)" if has_gpu else f"speedup {NOT_RUN}: there are no GPU records, so the right panel is empty"
        doc.add(
            "Agreement at each size (the same checks, tolerances and known differences as the full "
            "runs; failing checks by name, `against` the other run; the findings in docs/findings.md explain "
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


def writable(out: Path) -> Path:
    """The figures' folder beside `out`; a HarnessError where `out` is not a regular file or
    a missing one (a FIFO or a device is refused, not replaced by a file), or the figures'
    folder is not a folder."""
    ensure_replaceable(out)
    figures_dir = out.parent / FIGURES_DIR
    if figures_dir.is_symlink() or (figures_dir.exists() and not figures_dir.is_dir()):
        raise HarnessError(f"{figures_dir}: not a folder; refusing to write figures into it")
    return figures_dir


def write(doc: Document, out: Path) -> None:
    """Write the figures into figures/ beside `out`, then REPORT.md last, each file whole
    (harness/core/atomic.py). Of what is in figures/, only the figures an earlier report
    wrote and this one does not are removed: they are listed in figures/.written-by-harness.
    Nothing else in either folder is touched."""
    figures_dir = writable(out)
    manifest = figures_dir / WRITTEN
    earlier = set()
    if manifest.is_file() and not manifest.is_symlink():
        earlier = {name for name in manifest.read_text(errors="replace").split() if FIGURE_NAME.fullmatch(name)}
    for name, payload in doc.figures.items():
        atomic_write(figures_dir / name, payload)
    for name in sorted(earlier - set(doc.figures)):
        stale = figures_dir / name
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
    atomic_write(manifest, "".join(f"{name}\n" for name in sorted(doc.figures)).encode())
    atomic_write(out, ("\n".join(doc.lines).rstrip() + "\n").encode())


def report_path(results_dir: Path, out: Path | None) -> Path:
    """Where the report goes: `out` itself where it names a Markdown file (`.md`); else `out`
    is a folder that gets REPORT.md and figures/ (made when they are written, as their files
    are: a report that fails leaves no empty folder); by default the results folder is."""
    if out is None:
        return results_dir / REPORT_NAME
    if out.suffix.lower() == ".md" and not out.is_dir():
        return out
    if out.exists() and (out.is_symlink() or not out.is_dir()):
        raise HarnessError(f"--out {out}: neither a Markdown file (.md) nor a folder; refusing to write the report there")
    return out / REPORT_NAME


def report(results_dir: Path, out: Path | None = None, profile: str | None = None) -> tuple[Path, Document]:
    out = report_path(results_dir, out)
    writable(out)  # before the figures are drawn, not after
    doc = build(results_dir, profile)
    write(doc, out)
    return out, doc
