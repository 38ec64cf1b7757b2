"""The report's figures, drawn with matplotlib from records and their .npz artifacts.

Imported only by harness/report/document.py when a report is built (`import harness` stays free of
matplotlib). Figures are made with matplotlib.figure.Figure, not pyplot: no global state,
no display backend; PNGs are written by Agg without a date or software tag, so the same
records give the same bytes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from harness.core.registry import STRICT
from harness.inputs import data
from harness.inputs import problem as inputs
from harness.records.schema import Record
from harness.records.store import Sources, Unavailable, final_params, record_order, record_spec, run_label
from harness.reference.network import predict
from harness.report.rows import CURVE_POINTS, NOT_RUN, bench_pairs
from harness.report.speed import SpeedRow
from harness.spec.load import LoadedSpec
from harness.spec.model import Spec, SpeedupClaim

DPI = 100
PEAKS_FIGURE_POINTS = 40  # the article's coarser grid for the figure
MESH_STEP = 0.01  # the moons article's decision-boundary mesh
CPU_COLOR, GPU_COLOR = "#4C72B0", "#DD8452"
PLAIN_COLOR, TRANSFER_COLOR, CLAIM_COLOR = "#55A868", "#8172B3", "#C44E52"


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None}, bbox_inches="tight")
    return buf.getvalue()


def _not_run(ax, x: float, text: str = NOT_RUN) -> None:
    """Mark a missing bar: the text stands in its place, from the bottom of the axes."""
    ax.text(x, 0.03, text, transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="bottom", fontsize=8, color="0.35")


def _row_label(row: SpeedRow, hosts: int) -> str:
    label = row.cell.framework
    if row.cell.mode != "eager":
        label += f" {row.cell.mode}"
    if row.cell.precision != STRICT:
        label += f"\nGPU {row.cell.precision}"
    if hosts > 1:
        label += f"\n{row.cell.host}"
    return label


def _rows_by_spec(rows: list[SpeedRow]) -> dict[str, list[SpeedRow]]:
    grouped: dict[str, list[SpeedRow]] = {}
    for row in rows:
        grouped.setdefault(row.cell.spec, []).append(row)
    return grouped


def _ms(record: Record | None) -> float | None:
    if record is None or record.status != "ok" or record.timings is None:
        return None
    return record.timings.per_step_s * 1e3


def _legend_below(ax, handles: list) -> None:
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=len(handles), fontsize=8, frameon=False)


def _bar(ax, x: float, value: float, color: str, text: str) -> None:
    bars = ax.bar(x, value, width=0.4, color=color)
    ax.bar_label(bars, [text], fontsize=7, padding=1)


def _panels(grouped: dict[str, list]):
    """A figure with one panel side by side per group; (axes, group name, its items) per panel."""
    fig = Figure(figsize=(max(6.0, 4.4 * len(grouped)), 4.4), layout="constrained")
    axes = fig.subplots(1, len(grouped), squeeze=False)[0]
    return fig, [(ax, name, mine) for ax, (name, mine) in zip(axes, grouped.items())]


def _spec_panels(rows: list[SpeedRow]):
    """A figure with one panel per spec; (axes, spec name, its rows) per panel, and the host count."""
    fig, panels = _panels(_rows_by_spec(rows))
    return fig, panels, len({row.cell.host for row in rows})


def time_per_step_bars(rows: list[SpeedRow]) -> Figure:
    """Per spec one panel: per framework a CPU bar and a GPU bar of ms per step."""
    fig, panels, hosts = _spec_panels(rows)
    for ax, spec_name, mine in panels:
        x = np.arange(len(mine))
        for offset, side, color in ((-0.2, "cpu", CPU_COLOR), (0.2, "gpu", GPU_COLOR)):
            for xi, row in zip(x, mine):
                record = getattr(row, side)
                value = _ms(record)
                if value is None:
                    _not_run(ax, xi + offset, NOT_RUN if record is None else record.status)
                else:
                    _bar(ax, xi + offset, value, color, f"{value:.3g}")
        ax.margins(y=0.12)
        ax.set_xlim(-0.6, len(mine) - 0.4)
        ax.set_xticks(x, [_row_label(row, hosts) for row in mine])
        ax.set_title(f"{spec_name} ({mine[0].cell.n_train:,} points)")
        ax.set_xlabel("framework")
        ax.set_ylabel("training time per step (ms)")
        _legend_below(ax, [Patch(color=CPU_COLOR, label="CPU"), Patch(color=GPU_COLOR, label="GPU")])
    fig.suptitle("Time per training step, CPU and GPU (median of the repeats)")
    return fig


def _claim(ax, claim: SpeedupClaim | None):
    """Draw the article's claim: a band from low to high, or a line; return its legend handle."""
    if claim is None:
        return None
    if claim.high > claim.low:
        return ax.axhspan(claim.low, claim.high, color=CLAIM_COLOR, alpha=0.15, label=f"article: {claim.low:g}-{claim.high:g}x")
    return ax.axhline(claim.low, color=CLAIM_COLOR, linestyle="--", label=f"article: {claim.low:g}x")


def speedup_bars(rows: list[SpeedRow], claims: dict[str, SpeedupClaim | None]) -> Figure:
    """Per spec one panel: per framework the speedup without and with transfers, and the claim."""
    fig, panels, hosts = _spec_panels(rows)
    for ax, spec_name, mine in panels:
        x = np.arange(len(mine))
        values = []
        for xi, row in zip(x, mine):
            for offset, value, color in ((-0.2, row.speedup, PLAIN_COLOR), (0.2, row.speedup_with_transfers, TRANSFER_COLOR)):
                if value is None:
                    _not_run(ax, xi + offset)
                else:
                    _bar(ax, xi + offset, value, color, f"{value:.3g}x")
                    values.append(value)
        claim = claims.get(spec_name)
        handles = [Patch(color=PLAIN_COLOR, label="speedup"), Patch(color=TRANSFER_COLOR, label="with transfers")]
        handles.append(_claim(ax, claim))
        ax.axhline(1.0, color="0.3", linewidth=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        top = max([*values, claim.high if claim else 1.0, 1.0])
        bottom = min([*values, claim.low if claim else 1.0, 1.0])
        ax.set_ylim(bottom / 4, top * 4)
        ax.set_xlim(-0.6, len(mine) - 0.4)
        ax.set_xticks(x, [_row_label(row, hosts) for row in mine])
        ax.set_title(spec_name)
        ax.set_xlabel("framework")
        ax.set_ylabel("speedup, CPU time / GPU time (log scale)")
        _legend_below(ax, [h for h in handles if h is not None])
    fig.suptitle("GPU over CPU speedup (1x: break-even)")
    return fig


def relative_difference(a: np.ndarray, b: np.ndarray, clip: float) -> np.ndarray:
    """|a - b| / |b| over the common steps, clipped below at `clip` (for a log scale)."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(a - b) / np.abs(b)
    rel = np.where(np.isfinite(rel), rel, np.inf)
    return np.maximum(rel, clip)


def block_maximum(values: np.ndarray, points: int = CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(last step of each block, maximum over the block), for at most `points` blocks."""
    size = max(1, math.ceil(len(values) / points))
    blocks = [values[i : i + size] for i in range(0, len(values), size)]
    ends = np.arange(len(blocks)) * size + np.array([len(b) for b in blocks]) - 1
    return ends, np.array([b.max() for b in blocks])


def _curve_panel(ax, pairs: Iterable[tuple[Record, Record]], sources: Sources, clip: float, title: str) -> bool:
    drawn = False
    for a, b in pairs:
        try:
            la, lb = sources.losses(a), sources.losses(b)
        except Unavailable:
            continue
        rel = relative_difference(la, lb, clip)
        label = f"{run_label(a)} vs {'oracle' if b.framework == 'oracle' else run_label(b)}"
        equal = int(np.sum(la[: len(rel)] == lb[: len(rel)]))
        if equal:
            label += f" ({equal:,} of {len(rel):,} steps equal)"
        steps, worst = block_maximum(rel)
        style = "--" if "gpu" in (a.device.kind, b.device.kind) else "-"
        ax.plot(steps, worst, style, linewidth=0.9, label=label)
        drawn = True
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_yscale("log")
    return drawn


def divergence(
    spec_name: str,
    vs_oracle: list[tuple[Record, Record]],
    between: list[tuple[Record, Record]],
    sources: Sources,
    rtol: float | None,
    clip: float,
    envelope: np.ndarray | None = None,
) -> Figure:
    """The relative loss difference per step, each run against the oracle and between runs,
    with the lines that judge them: the envelope `factor * e(t) + curve_floor` (every pair's
    verdict), and the spec's own `loss_curve.rtol` where it states one (the horizon).
    Differences below `clip` (exactly equal steps among them) are drawn at `clip`."""
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    drawn = _curve_panel(left, vs_oracle, sources, clip, "each run against the float64 oracle")
    drawn |= _curve_panel(right, between, sources, clip, "between runs")
    if not drawn:
        raise Unavailable("no loss curve could be read from the artifacts")
    for ax in (left, right):
        if envelope is not None:
            steps, allowed = block_maximum(np.asarray(envelope, dtype=np.float64))
            ax.plot(steps, allowed, color="black", linewidth=1.4, label="tolerance: the envelope factor * e(t) + curve_floor (the verdict)")
        if rtol is not None:
            ax.axhline(rtol, color="black", linestyle="--", linewidth=1, label=f"loss_curve.rtol = {rtol:g} (the horizon)")
        ax.axhline(clip, color="0.6", linestyle=":", linewidth=1, label=f"{clip:g}: drawn here when smaller (exactly equal among them)")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, fontsize=7, frameon=False)
    left.set_ylabel("relative loss difference |a - b| / |b|")
    if any(len(sources.losses(a)) > CURVE_POINTS for a, _ in vs_oracle + between):
        left.set_xlabel("training step (maximum over blocks of steps)")
        right.set_xlabel("training step (maximum over blocks of steps)")
    fig.suptitle(f"{spec_name}: how far the loss curves drift apart")
    return fig


# --- the articles' figures --------------------------------------------------------------


def _not_a_port(spec: Spec) -> None:
    """A port's net is the user's code, which only `harness run` runs: no figure draws it."""
    if spec.model.is_port:
        raise Unavailable(f"{spec.name} is a port: its net is the user's code, which only harness run runs")


def net_outputs(record: Record, sources: Sources, x: np.ndarray) -> np.ndarray:
    """The final net of a run on inputs x, in float64 from its stored float32 parameters."""
    spec = record_spec(record)
    params = final_params(sources.artifact(record))
    placed = spec.model.placed
    chunks = [predict(np, placed, params, x[i : i + 16384]) for i in range(0, len(x), 16384)]
    return np.concatenate(chunks)


def peaks_surfaces(a: Record, b: Record, sources: Sources) -> Figure:
    """The training data and two trained nets on the article's 40x40 grid, in 3D."""
    spec = record_spec(a)
    if spec.data.kind != "peaks_grid":
        raise Unavailable(f"{spec.name} is not a peaks spec")
    _not_a_port(spec)
    coarse = spec.data.model_copy(update={"points_per_axis": PEAKS_FIGURE_POINTS})
    features, target = data.peaks_grid(coarse)
    axis = features[:PEAKS_FIGURE_POINTS, 0]
    x1, x2 = np.meshgrid(axis, axis)  # x1 varies fastest in the grid, as along a row here
    shape = (PEAKS_FIGURE_POINTS, PEAKS_FIGURE_POINTS)
    panels = [("training data: peaks(x1, x2)", target.reshape(shape), "surface")]
    for record in (a, b):
        out = net_outputs(record, sources, features.astype(np.float64)).reshape(shape)
        loss = record.metrics.final_loss if record.metrics else float("nan")
        panels.append((f"{run_label(record)} net (final loss {loss:.4g})", out, "wireframe"))
    low = min(float(z.min()) for _, z, _ in panels)
    high = max(float(z.max()) for _, z, _ in panels)
    fig = Figure(figsize=(15, 5))
    for i, (title, z, style) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, 3, i, projection="3d")
        if style == "surface":
            ax.plot_surface(x1, x2, z, cmap="viridis", linewidth=0, antialiased=True)
        else:
            ax.plot_wireframe(x1, x2, z, color=CPU_COLOR if i == 2 else GPU_COLOR, linewidth=0.6)
        ax.set_zlim(low, high)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("x1 (input)")
        ax.set_ylabel("x2 (input)")
        ax.set_zlabel("output y")
    fig.suptitle(f"{spec.name}: the peaks surface and two trained nets on a {PEAKS_FIGURE_POINTS}x{PEAKS_FIGURE_POINTS} grid")
    fig.subplots_adjust(left=0.02, right=0.98, wspace=0.05)
    return fig


def training_points(record: Record) -> tuple[np.ndarray, np.ndarray]:
    """The record's training data, made again by the harness's own data code."""
    spec: Spec = record_spec(record)
    loaded = LoadedSpec(
        spec=spec, path=Path(record.spec.path), sha256=record.spec.sha256, profile=record.spec.profile, overrides=record.spec.overrides
    )
    problem = inputs.build_problem(loaded)
    return problem.x_train, problem.y_train


def moons_boundaries(records: list[Record], sources: Sources) -> Figure:
    """Per run the predicted class on a mesh of step 0.01 (filled contour), points on top."""
    if not records:
        raise Unavailable("no finished moons runs with final parameters")
    _not_a_port(record_spec(records[0]))
    records = sorted(records, key=record_order)
    x, y = training_points(records[0])
    g1 = np.arange(x[:, 0].min() - 0.5, x[:, 0].max() + 0.5, MESH_STEP)
    g2 = np.arange(x[:, 1].min() - 0.5, x[:, 1].max() + 0.5, MESH_STEP)
    m1, m2 = np.meshgrid(g1, g2)
    mesh = np.column_stack([m1.ravel(), m2.ravel()])
    cols = min(4, len(records))
    rows = math.ceil(len(records) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    cmap = matplotlib.colormaps["Spectral"]
    for ax, record in zip(axes, records):
        predicted = net_outputs(record, sources, mesh).argmax(axis=1).reshape(m1.shape)
        ax.contourf(m1, m2, predicted, levels=[-0.5, 0.5, 1.5], cmap=cmap, alpha=0.8)
        ax.scatter(x[:, 0], x[:, 1], c=y, cmap=cmap, s=2, edgecolors="none", vmin=0, vmax=1)
        acc = record.metrics.values.get("train_accuracy") if record.metrics else None
        ax.set_title(f"{run_label(record)} {record.dtype}" + (f" (train acc. {acc:.4f})" if acc is not None else ""), fontsize=9)
        ax.set_xlabel("x1 (feature)")
        ax.set_ylabel("x2 (feature)")
    for ax in axes[len(records) :]:
        ax.set_visible(False)
    fig.suptitle(f"{records[0].spec.name}: decision boundary of each final net, training points on top")
    return fig


# --- the crossover sweep ----------------------------------------------------------------


def _series(rows: list[SpeedRow], side: str) -> dict[str, tuple[list[int], list[float]]]:
    lines: dict[str, tuple[list[int], list[float]]] = {}
    hosts = len({row.cell.host for row in rows})
    for row in rows:
        value = _ms(getattr(row, side))
        if value is None:
            continue
        mode = f" {row.cell.precision}" if side == "gpu" and row.cell.precision != STRICT else ""
        label = f"{row.cell.framework}@{side}{mode}" + (f" ({row.cell.host})" if hosts > 1 else "")
        if side == "cpu" and any(label == known for known in lines) and row.cell.precision != STRICT:
            continue  # the same CPU record stands against a TF32 GPU run too
        xs, ys = lines.setdefault(label, ([], []))
        if row.cell.n_train not in xs:
            xs.append(row.cell.n_train)
            ys.append(value)
    return lines


def sweep(spec_name: str, rows: list[SpeedRow], claim: SpeedupClaim | None) -> Figure:
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    left, right = fig.subplots(1, 2)
    for side, style in (("cpu", "-o"), ("gpu", "--s")):
        for label, (xs, ys) in sorted(_series(rows, side).items()):
            left.plot(xs, ys, style, markersize=4, label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_title("time per step")
    left.set_xlabel("training points (log scale)")
    left.set_ylabel("training time per step (ms, log scale)")
    left.legend(fontsize=8)
    speedups: dict[str, tuple[list[int], list[float]]] = {}
    for row in rows:
        if row.speedup is not None:
            label = row.cell.framework + (f" {row.cell.precision}" if row.cell.precision != STRICT else "")
            xs, ys = speedups.setdefault(label, ([], []))
            xs.append(row.cell.n_train)
            ys.append(row.speedup)
    for label, (xs, ys) in sorted(speedups.items()):
        right.plot(xs, ys, "-o", markersize=4, label=label)
    right.set_xscale("log")
    right.set_title("speedup GPU/CPU")
    right.set_xlabel("training points (log scale)")
    right.set_ylabel("speedup, CPU time / GPU time (x)")
    if speedups:
        right.set_yscale("log")
        right.axhline(1.0, color="0.3", linewidth=0.8, label="break-even")
        _claim(right, claim)
        right.legend(fontsize=8)
    else:
        n = [row.cell.n_train for row in rows]
        right.set_xlim(min(n) / 2, max(n) * 2)
        right.text(0.5, 0.5, f"GPU {NOT_RUN}:\nno speedup to plot", transform=right.transAxes, ha="center", va="center", fontsize=12, color="0.35")
    fig.suptitle(f"{spec_name}: crossover sweep over the data size")
    return fig


def floor_bars(records) -> Figure:
    """Per spec one panel: per framework and device the measured time per step over the
    floor, eager and fast side by side (log scale)."""
    grouped: dict[str, list] = {}
    for cell, modes in bench_pairs(records).items():
        label = f"{cell.framework}\n{cell.device}" + ("" if cell.precision == STRICT else f" {cell.precision}")
        grouped.setdefault(f"{cell.spec} ({cell.profile}, {cell.n_train:,} points)", []).append((label, modes))
    fig, panels = _panels(grouped)
    for ax, spec_name, cells in panels:
        for xi, (_label, modes) in enumerate(cells):
            for offset, mode, color in ((-0.2, "eager", CPU_COLOR), (0.2, "fast", GPU_COLOR)):
                record = modes.get(mode)
                ratio = record.floor.measured_over_floor if record and record.floor else None
                if ratio is None:
                    _not_run(ax, xi + offset)
                else:
                    _bar(ax, xi + offset, ratio, color, f"{ratio:.3g}")
        ax.set_xticks(range(len(cells)), [label for label, _ in cells], fontsize=8)
        ax.set_yscale("log")
        ax.axhline(1.0, color="0.3", linewidth=0.8)
        ax.set_title(spec_name)
        ax.set_ylabel("measured / floor (log scale)")
        ax.legend(
            handles=[Patch(color=CPU_COLOR, label="eager"), Patch(color=GPU_COLOR, label="fast")],
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.18),
            ncol=2,
        )
    return fig
