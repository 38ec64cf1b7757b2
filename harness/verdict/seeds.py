"""The verdict over seeds (issue 86): where step-by-step parity ends (a chaotic workload, a
bf16 run, a GPU's nondeterministic kernels), runs are judged by their distributions over
seeds. Each seed draws the initial weights and the batch order afresh, and both sides of a
pair take the same draw (the inputs stay neutral), so a pair's seeds are paired: the
difference of each seed's final measure, side against side, is what rounding and chaos
spread, and a difference of the math shifts its mean.

Per measure (each final metric of the whole sets: the loss, the accuracy) and per pair (a
framework's cell against the first framework's cell of its precision and mode): each
side's olympic mean (MLPerf's: the highest and the lowest seed dropped), the mean of the
paired differences beside their spread over the seeds, and Student's t-test on the paired
differences. Each direction is tested one-sided at half the level (registry.SEEDS_ALPHA,
0.05), and the level is shared among the verdict's checks over seeds (Bonferroni): an
honest matrix fails its verdict over seeds at most 1 time in 20, by construction; so its
checks are measured and listed, and gate no verdict yet (registry.OVER_SEEDS,
report.rows.gating). A check's ratio is its mean difference over the difference the test
would just call significant (> 1 fails), as every other check's error over its tolerance is."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.core.registry import LEAST_SEEDS, OVER_SEEDS, SEEDS_ALPHA, CheckVerdict, RunKey
from harness.verdict.bound import Bound
from harness.verdict.checks import Check

DISTRIBUTION = "distribution"  # the diagnosis's first word, where the distributions differ


def olympic_mean(values: Sequence[float]) -> float:
    """The mean without the highest and the lowest value (MLPerf's), of 3 or more."""
    ordered = sorted(values)
    return float(np.mean(ordered[1:-1] if len(ordered) >= 3 else ordered))


def critical_t(df: int, alpha: float) -> float:
    """Student's t that a one-sided test at `alpha` with `df` degrees of freedom just rejects at."""
    from scipy import stats

    return float(stats.t.ppf(1.0 - alpha, df))


def p_value(t: float, df: int) -> float:
    """The two one-sided tests' p: twice the upper tail of |t|."""
    from scipy import stats

    return float(2.0 * stats.t.sf(abs(t), df))


@dataclass(frozen=True)
class OverSeeds:
    """One measure of one pair over the seeds: each side's values (seed by seed, NaN where
    its run failed or diverged), and the paired test's figures over the seeds both finished."""

    measure: str
    run: RunKey
    reference: RunKey
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    reference_values: tuple[float, ...]

    @property
    def both(self) -> np.ndarray:
        a, b = np.asarray(self.values), np.asarray(self.reference_values)
        return np.isfinite(a) & np.isfinite(b)

    @property
    def differences(self) -> np.ndarray:
        return (np.asarray(self.values) - np.asarray(self.reference_values))[self.both]

    @property
    def n(self) -> int:
        return int(self.both.sum())

    @property
    def mean_difference(self) -> float:
        return float(np.mean(self.differences)) if self.n else math.nan

    @property
    def spread(self) -> float:
        """The paired differences' standard deviation over the seeds: the yardstick."""
        return float(np.std(self.differences, ddof=1)) if self.n > 1 else math.nan

    def olympic(self, which: str) -> float:
        values = np.asarray(self.values if which == "run" else self.reference_values)[self.both]
        return olympic_mean(values) if len(values) else math.nan

    def t(self) -> float:
        if self.spread == 0.0:  # every seed the same on both sides (or the same offset)
            return 0.0 if self.mean_difference == 0.0 else math.copysign(math.inf, self.mean_difference)
        return self.mean_difference / (self.spread / math.sqrt(self.n))

    def ratio(self, alpha: float) -> float:
        """|t| over the t that a one-sided test at alpha / 2 just rejects at."""
        return abs(self.t()) / critical_t(self.n - 1, alpha / 2.0)

    def detectable(self, alpha: float) -> float:
        """The paired differences' mean that the test at `alpha` just calls significant: the
        least difference these seeds can tell from their spread (the check's tolerance)."""
        return critical_t(self.n - 1, alpha / 2.0) * self.spread / math.sqrt(self.n)


def pairs(keys: Sequence[RunKey]) -> list[tuple[RunKey, RunKey]]:
    """Each cell and the cell it is judged against: the first of its precision and mode among
    `keys` (the first framework asked for, on the first device)."""
    found, first = [], {}
    for key in keys:
        group = (key.precision, key.mode)
        if group in first:
            found.append((key, first[group]))
        else:
            first[group] = key
    return found


def measures(values: dict[RunKey, list[dict[str, float]]]) -> list[str]:
    """The final metrics every seed's run of every cell has (a failed run has none)."""
    names = None
    for runs in values.values():
        for metrics in runs:
            if metrics:
                names = set(metrics) if names is None else names & set(metrics)
    return sorted(names or ())


def judged(rows: list[OverSeeds]) -> list[Check]:
    """A check per row, SEEDS_ALPHA shared among them: FAIL where the paired differences' mean is
    beyond what their spread over the seeds makes likely, saying by how much and why."""
    alpha = SEEDS_ALPHA / max(len(rows), 1)
    checks = []
    for row in rows:
        name = OVER_SEEDS + row.measure
        test = f"Student's t at {alpha / 2:.3g} a side (the verdict's {SEEDS_ALPHA} shared among {len(rows)} check(s) over seeds)"
        if row.n < LEAST_SEEDS:
            reason = f"{row.n} seeds finished on both sides (a run failed or diverged at the others); a verdict over seeds takes {LEAST_SEEDS}"
            checks.append(Check(name, row.run, row.reference, CheckVerdict.SKIPPED, f"over {len(row.seeds)} seeds, {test}", reason=reason))
            continue
        allowed = row.detectable(alpha)
        tolerance = f"the paired differences' mean over {row.n} seeds within {allowed:.3g}: {test}"
        ratio = row.ratio(alpha)
        figures = (
            f"{row.run.label}'s {row.measure} olympic mean {row.olympic('run'):.6g} against {row.reference.label}'s "
            f"{row.olympic('reference'):.6g} over {row.n} seeds: the paired differences' mean {row.mean_difference:+.3g}, "
            f"their spread {row.spread:.3g} (t = {row.t():.2f}, p = {p_value(row.t(), row.n - 1):.2g})"
        )
        verdict = CheckVerdict.FAIL if ratio > 1.0 else CheckVerdict.PASS
        diagnosis = None
        if verdict == CheckVerdict.FAIL:
            diagnosis = (
                f"{DISTRIBUTION}: {figures}; beyond what the seeds' rounding and chaos spread to, at {ratio:.2f}x the "
                f"difference the test just calls significant: the runs compute another training (its math, its "
                f"inputs, a hyper-parameter), not the same one rounded otherwise"
            )
        reference = abs(row.olympic("reference"))
        checks.append(
            Check(
                name,
                row.run,
                row.reference,
                verdict,
                tolerance,
                max_abs_error=abs(row.mean_difference),
                max_rel_error=abs(row.mean_difference) / reference if reference > 0 else None,
                reason=figures,
                ratio=ratio,
                diagnosis=diagnosis,
                bound=Bound("seeds", "max_abs", allowed=allowed, members=row.n),  # the mean's |difference| over it is the ratio
            )
        )
    return checks


def rows_of(keys: Sequence[RunKey], seeds: Sequence[int], values: dict[RunKey, list[dict[str, float]]]) -> list[OverSeeds]:
    """Each pair's rows, a measure each, from each cell's final metrics seed by seed."""

    def column(key: RunKey, measure: str) -> tuple[float, ...]:
        return tuple(float(m.get(measure, math.nan)) if m else math.nan for m in values[key])

    names = measures(values)
    return [
        OverSeeds(measure, run, reference, tuple(seeds), column(run, measure), column(reference, measure))
        for run, reference in pairs([k for k in keys if k in values])
        for measure in names
    ]
