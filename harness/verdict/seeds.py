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

from harness.calibrate.spread import relative_curve_distance
from harness.core.registry import BF16, FLOAT32, HORIZON, LEAST_SEEDS, OVER_SEEDS, SEEDS_ALPHA, CheckVerdict, RunKey
from harness.verdict.bound import Bound
from harness.verdict.checks import EPS, ROUNDING_ULPS, Check, parted_at

DISTRIBUTION = "distribution"  # the diagnosis's first word, where the distributions differ
ANOTHER = "the runs compute another training (its math, its inputs, a hyper-parameter), not the same one rounded otherwise"
HORIZON_MARGIN = math.log(2.0)  # a pair may part up to twice as early as rounding parts runs (in log(1 + step))


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


class Paired:
    """Seed by seed, a measure of a pair (`values`) beside its reference's
    (`reference_values`), NaN where a run is missing: the seeds both have, and the paired
    differences' (`differences`) mean and spread."""

    @property
    def both(self) -> np.ndarray:
        a, b = np.asarray(self.values), np.asarray(self.reference_values)
        return np.isfinite(a) & np.isfinite(b)

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


@dataclass(frozen=True)
class OverSeeds(Paired):
    """One measure of one pair over the seeds: each side's values (seed by seed, NaN where
    its run failed or diverged), and the paired test's figures over the seeds both finished.
    With a yardstick (the same training rounded otherwise, seeded.yardsticks), its values
    too: how far rounding alone moves the measure from the reference's at these seeds, the
    least difference the check may call another training (reach)."""

    measure: str
    run: RunKey
    reference: RunKey
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    reference_values: tuple[float, ...]
    yardstick: RunKey | None = None
    yardstick_values: tuple[float, ...] = ()

    @property
    def floor(self) -> float:
        """ROUNDING_ULPS units of float32's rounding of the measure (the reference's olympic
        mean): the precision a final metric is summed in, whatever the run's (a bf16 run's
        loss too), below which no difference is another training however consistent over
        the seeds (moons_net's quick profile: JAX's final loss 0.2 ulp below torch's on
        each of 5 seeds, t = -4.2)."""
        reference = self.olympic("reference")
        return ROUNDING_ULPS * EPS[FLOAT32] * abs(reference) if math.isfinite(reference) else 0.0

    @property
    def reach(self) -> float:
        """The yardstick's largest distance from the reference over the seeds both finished
        (0 without a yardstick): a mean difference within it is rounding's, however
        consistent over the seeds."""
        if self.yardstick is None:
            return 0.0
        gap = np.abs(np.asarray(self.yardstick_values) - np.asarray(self.reference_values))
        return float(np.max(gap[np.isfinite(gap)], initial=0.0))

    @property
    def differences(self) -> np.ndarray:
        return (np.asarray(self.values) - np.asarray(self.reference_values))[self.both]

    def t(self) -> float:
        if self.spread == 0.0:  # every seed the same on both sides (or the same offset)
            return 0.0 if self.mean_difference == 0.0 else math.copysign(math.inf, self.mean_difference)
        return self.mean_difference / (self.spread / math.sqrt(self.n))

    def detectable(self, alpha: float) -> float:
        """The paired differences' mean that the test at `alpha` just calls significant: the
        least difference these seeds can tell from their spread (the check's tolerance)."""
        return critical_t(self.n - 1, alpha / 2.0) * self.spread / math.sqrt(self.n)

    def judged(self, alpha: float, count: int) -> Check:
        name = OVER_SEEDS + self.measure
        test = _test(alpha, count)
        few = _too_few(name, self, test)
        if few is not None:
            return few
        detectable, reach, floor = self.detectable(alpha), self.reach, self.floor
        allowed = max(detectable, reach, floor)
        tolerance = f"the paired differences' mean over {self.n} seeds within {allowed:.3g}: {test}"
        tolerance += f", and beyond {floor:.3g} ({ROUNDING_ULPS} float32 ulps of the measure)"
        if self.yardstick is not None:
            tolerance += (
                f", and beyond rounding's reach {reach:.3g} ({self.reference.label} against {self.yardstick.label}, "
                f"the same training rounded otherwise, at its farthest seed)"
            )
        ratio = abs(self.mean_difference) / allowed if allowed > 0 else (0.0 if self.mean_difference == 0 else math.inf)
        figures = (
            f"{self.run.label}'s {self.measure} olympic mean {self.olympic('run'):.6g} against {self.reference.label}'s "
            f"{self.olympic('reference'):.6g} over {self.n} seeds: the paired differences' mean {self.mean_difference:+.3g}, "
            f"their spread {self.spread:.3g} (t = {self.t():.2f}, p = {p_value(self.t(), self.n - 1):.2g})"
        )
        reaches = " and rounding reaches" if self.yardstick is not None else ""
        why = f"beyond what the seeds' rounding and chaos spread to, at {ratio:.2f}x the difference the test just calls significant{reaches}"
        verdict, diagnosis = _said(ratio, f"{figures}; {why}: {ANOTHER}")
        reference = abs(self.olympic("reference"))
        return Check(
            name,
            self.run,
            self.reference,
            verdict,
            tolerance,
            max_abs_error=abs(self.mean_difference),
            max_rel_error=abs(self.mean_difference) / reference if reference > 0 else None,
            reason=figures,
            ratio=ratio,
            diagnosis=diagnosis,
            bound=Bound("seeds", "max_abs", allowed=allowed, members=self.n),  # the mean's |difference| over it is the ratio
        )




def horizon(a: np.ndarray | None, b: np.ndarray | None, rtol: float) -> float:
    """The first step at which two loss curves part by more than `rtol` (relative; a
    non-finite loss parts them), their length where they never do; NaN without both."""
    if a is None or b is None:
        return math.nan
    steps = min(len(a), len(b))
    return float(parted_at(relative_curve_distance(np.asarray(a[:steps], np.float64), np.asarray(b[:steps], np.float64)), rtol))


def horizon_rtol(key: RunKey) -> float:
    """Where a pair's loss curves count as parted: the geometric middle between the
    precision's unit of rounding and 1 (float32 3.5e-4, bf16 0.088), far from both what
    rounding starts runs apart by and where chaos leaves them."""
    return math.sqrt(EPS[BF16 if key.precision == BF16 else key.dtype])


@dataclass(frozen=True)
class Horizons(Paired):
    """Where step-by-step parity ends, seed by seed: the step at which a pair's loss curves
    part (horizon, horizon_rtol), beside the step at which the pair's reference parts from
    the yardstick, the same training rounded otherwise (a calibration member: the
    reference's code with its sums in another order) at the same seed. Two honest runs of a
    chaotic training start a rounding apart and part where chaos has grown that to rtol, at a
    step that varies with the seed; a different training (its math, a hyper-parameter)
    starts them apart by its difference and parts them at once. Chaos grows a difference
    geometrically, so a run's horizon falls with the log of its first difference: the
    measure is each seed's log(1 + horizon) against the yardstick's, and a pair fails where
    it parts more than twice as early as rounding parts runs (HORIZON_MARGIN: a first
    difference hundreds of roundings wide on peaks), beyond what the seeds' spread leaves
    (Student's t on the paired logs, one-sided). Two libraries rounding otherwise (a few
    ulps here and there) part a few steps earlier or later; past the margin, no number of
    seeds makes that a failure."""

    run: RunKey
    reference: RunKey
    yardstick: RunKey
    seeds: tuple[int, ...]
    values: tuple[float, ...]  # the pair's horizon, seed by seed (NaN where a run is missing)
    reference_values: tuple[float, ...]  # the yardstick pair's
    rtol: float
    measure: str = HORIZON

    @property
    def differences(self) -> np.ndarray:
        """Each seed's log(1 + horizon) less the yardstick's: below 0 where the pair parts earlier."""
        return (np.log1p(np.asarray(self.values)) - np.log1p(np.asarray(self.reference_values)))[self.both]

    def allowance(self, alpha: float) -> float:
        """How much earlier (in log(1 + horizon)) the pair may part: the margin, and what the
        seeds' spread leaves the test at `alpha` (one-sided)."""
        return HORIZON_MARGIN + critical_t(self.n - 1, alpha / 2.0) * self.spread / math.sqrt(self.n)

    def judged(self, alpha: float, count: int) -> Check:
        name = OVER_SEEDS + self.measure
        test = _test(alpha, count, "one-sided, a pair parting earlier")
        few = _too_few(name, self, test)
        if few is not None:
            return few
        allowed = self.allowance(alpha)
        earlier = 0.0 - self.mean_difference  # log(1 + step): how much earlier the pair parts
        ratio = max(earlier, 0.0) / allowed + 0.0
        factor = math.exp(earlier)
        tolerance = (
            f"each seed's loss curves parted (relative difference over {self.rtol:.2g}) no more than twice as early as "
            f"{self.reference.label} and {self.yardstick.label} (its sums in another order), in log(1 + step) over "
            f"{self.n} seeds within {allowed:.3g}: {test}"
        )
        figures = (
            f"{self.run.label} and {self.reference.label} part at step {self.olympic('run'):.3g} (olympic mean over "
            f"{self.n} seeds), {self.reference.label} and {self.yardstick.label} at {self.olympic('reference'):.3g}: "
            f"(1 + step) {factor:.3g}x smaller, their logs' spread {self.spread:.3g}"
        )
        why = f"rounding parts runs of this training later, seed by seed ({ratio:.2f}x what the margin and the seeds' spread allow)"
        verdict, diagnosis = _said(ratio, f"{figures}; {why}: {ANOTHER}, from its first steps")
        return Check(
            name,
            self.run,
            self.reference,
            verdict,
            tolerance,
            max_abs_error=max(earlier, 0.0),
            reason=figures,
            ratio=ratio,
            diagnosis=diagnosis,
            bound=Bound("seeds", "horizon", allowed=allowed, members=self.n),
        )


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


def judged(rows: list) -> list[Check]:
    """A check per row (OverSeeds, Horizons), SEEDS_ALPHA shared among them: FAIL where the
    paired differences' mean is beyond what their spread over the seeds makes likely, or
    where a pair parts earlier than rounding parts runs, saying by how much and why."""
    alpha = SEEDS_ALPHA / max(len(rows), 1)
    return [row.judged(alpha, len(rows)) for row in rows]


def _test(alpha: float, count: int, sides: str = "a side") -> str:
    return f"Student's t at {alpha / 2:.3g} {sides} (the verdict's {SEEDS_ALPHA} shared among {count} check(s) over seeds)"


def _said(ratio: float, text: str) -> tuple[CheckVerdict, str | None]:
    """FAIL and its diagnosis beyond the tolerance (ratio > 1), PASS and none within it."""
    return (CheckVerdict.FAIL, f"{DISTRIBUTION}: {text}") if ratio > 1.0 else (CheckVerdict.PASS, None)


def _too_few(name: str, row, test: str) -> Check | None:
    if row.n >= LEAST_SEEDS:
        return None
    reason = f"{row.n} seeds finished on every side (a run failed or diverged at the others); a verdict over seeds takes {LEAST_SEEDS}"
    return Check(name, row.run, row.reference, CheckVerdict.SKIPPED, f"over {len(row.seeds)} seeds, {test}", reason=reason)


def rows_of(
    keys: Sequence[RunKey], seeds: Sequence[int], values: dict[RunKey, list[dict[str, float]]], sticks: dict[RunKey, RunKey] | None = None
) -> list[OverSeeds]:
    """Each pair's rows, a measure each, from each cell's final metrics seed by seed (and
    its yardstick's, `sticks` by the pair's run, where `values` has them)."""

    def column(key: RunKey, measure: str) -> tuple[float, ...]:
        return tuple(float(m.get(measure, math.nan)) if m else math.nan for m in values[key])

    sticks = {run: stick for run, stick in (sticks or {}).items() if stick in values}
    names = measures({k: v for k, v in values.items() if k in keys})
    rows = []
    for run, reference in pairs([k for k in keys if k in values]):
        for measure in names:
            stick = sticks.get(run)
            yard = {} if stick is None else {"yardstick": stick, "yardstick_values": column(stick, measure)}
            rows.append(OverSeeds(measure, run, reference, tuple(seeds), column(run, measure), column(reference, measure), **yard))
    return rows


def by_key(rows: Sequence) -> dict[RunKey, tuple[list[int], dict[str, list[float | None]]]]:
    """Each run's final metrics seed by seed, from the rows of its pairs (OverSeeds; a run is
    a pair's run or its reference): the seeds' initial-weights seeds, and per metric its
    values (None where the run failed or diverged), as its record keeps them."""
    found: dict[RunKey, tuple[list[int], dict[str, list[float | None]]]] = {}
    for row in rows:
        if not isinstance(row, OverSeeds):
            continue
        for key, values in ((row.run, row.values), (row.reference, row.reference_values)):
            seeds, metrics = found.setdefault(key, (list(row.seeds), {}))
            metrics[row.measure] = [float(v) if math.isfinite(v) else None for v in values]
    return found
