"""How far rounding alone carries a spec, measured on the spec itself.

A calibration member trains the same problem with its sums in another order
(members.reordered): in exact arithmetic the same training, so its distance from the
reference is rounding and nothing else. The float32 members (the array-module code in
float32, against the float64 oracle) calibrate every float32 check; the float64 members
(the oracle's own code, reordered, against the oracle over the twins' first steps)
calibrate math parity. Every tolerance is then `factor * spread + floor` (a rounding floor,
harness/verdict/checks.py), with the spread taken here:

- the loss curve: the largest relative distance at each step, as a running maximum;
- outputs, the step-0 loss and the parameters after a step: the largest L2 distance of a
  member from the reference, per parameter tensor. A norm rather than elementwise bounds:
  rounding noise over a tensor's elements concentrates, so one run's norm predicts
  another's, while an element whose members all happened to round alike would fail an
  honest run elementwise; a change in the math moves a whole tensor, and the tensor
  whose ratio is largest says where a difference starts.

A member may diverge where the reference trains: rounding alone then carries the training
to a non-finite loss. Its steps before that are measured like any other's, and nothing after
the first member's divergence is bounded (`Spread.diverged`): the checks there are skipped
with that reason, and a run that diverges no earlier is not different math for diverging.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from harness.core.registry import CALIBRATION_KEY, ORACLE, ORACLE_KEY, RunKey
from harness.inputs.problem import Params
from harness.run.runner import Outcome

TINY = 1e-30


@dataclass(frozen=True)
class Spread:
    """The largest distance of `runs` rounding-only runs from their reference."""

    dtype: str
    runs: int
    curve: np.ndarray  # running maximum of the relative loss distance, per step
    initial_outputs: float  # L2 distance of the probe outputs before training
    initial_loss: float  # |difference| of the step-0 loss
    params: dict[int, list[float]]  # step -> L2 distance per tensor (in the network's order)
    final_outputs: float  # L2 distance of the probe outputs after the last step
    final_outputs_max: float  # the same, as the largest |difference| of one output
    # each final metric (train_loss, val_accuracy, ...): the largest |difference| of a
    # member's own, measured where the curve's e(T) is only a proxy (an evaluation-mode loss
    # through batch norm's running statistics rounds otherwise than the training loss)
    metrics: dict[str, float] = field(default_factory=dict)
    around: str = "the oracle"  # the reference, in a tolerance's prose (a port's: torch@cpu+float64)
    # the runs that diverged, by label: the step of each one's first non-finite loss or
    # parameters. The curve then ends before the first of them, the parameters are those of
    # the steps before it, and nothing after it (final outputs, metrics) is bounded.
    diverged: dict[str, int] = field(default_factory=dict)

    @property
    def finite_steps(self) -> int | None:
        """How many steps every run kept finite, where one diverged (None: all trained)."""
        return min(self.diverged.values()) if self.diverged else None

    @property
    def unbounded(self) -> str:
        """Why nothing from the first divergence on is bounded, in a check's prose."""
        first = min(self.diverged, key=self.diverged.__getitem__)
        return (
            f"rounding alone diverges this training: {len(self.diverged)} of {self.runs} {self.dtype} runs summing in other orders "
            f"diverged where {self.around} trained, the first ({first}) at step {self.diverged[first]}; nothing from there on is bounded"
        )


@dataclass(frozen=True)
class Segments:
    """The re-anchored twins' calibration (harness/run/anchored.py): for each segment, by
    the step it starts at, the oracle's own losses over it and the running maximum of the
    members' relative distance from them; and, where the reference kept them, its tensors
    and evaluation-mode probe outputs at the segment's end with the members' largest L2
    distance from them (per tensor, and over the outputs)."""

    runs: int
    reference: dict[int, np.ndarray]
    curve: dict[int, np.ndarray]
    end_reference: dict[int, Params] = field(default_factory=dict)
    end_params: dict[int, dict[str, float]] = field(default_factory=dict)  # by tensor name (optimizer moments too)
    output_reference: dict[int, np.ndarray] = field(default_factory=dict)
    end_outputs: dict[int, float] = field(default_factory=dict)


def measure_segments(oracle: Outcome | None, members: list[Outcome]) -> Segments | None:
    """The members' spread over each segment; None unless the oracle and every member ran
    every segment."""
    if oracle is None or oracle.status != "ok" or not members or any(m.status != "ok" for m in members):
        return None
    starts = sorted(oracle.anchor_states)
    if not starts or any(sorted(m.segments) != starts for m in members):
        return None
    reference = {a: oracle.losses[a : a + len(members[0].segments[a])] for a in starts}
    return measure_segments_against(reference, members, oracle.segment_ends, oracle.segment_outputs)


def measure_segments_against(
    reference: dict[int, np.ndarray], members: list[Outcome], ends: dict[int, Params] | None = None, outputs: dict[int, np.ndarray] | None = None
) -> Segments | None:
    """The members' spread over each segment around `reference` (each segment's losses, by
    the step it starts at), and at its end around `ends` and `outputs` (the reference's
    tensors and evaluation-mode probe outputs there) where the reference and every member
    kept them; None unless every member ran every segment."""
    starts = sorted(reference)
    if not starts or not members or any(m.status != "ok" or sorted(m.segments) != starts for m in members):
        return None
    curve = {a: np.maximum.accumulate(np.max([relative_curve_distance(m.segments[a], reference[a]) for m in members], axis=0)) for a in starts}
    ends, outputs = ends or {}, outputs or {}
    judged = [a for a in starts if a in ends and a in outputs and all(a in m.segment_ends and a in m.segment_outputs for m in members)]
    # by name: the tensors and moments the reference and every member kept
    end_params = {
        a: {
            name: max(_l2(m.segment_ends[a][name], ends[a][name]) for m in members)
            for name in ends[a]
            if all(name in m.segment_ends[a] and np.shape(m.segment_ends[a][name]) == np.shape(ends[a][name]) for m in members)
        }
        for a in judged
    }
    end_outputs = {a: max(_l2(m.segment_outputs[a], outputs[a]) for m in members) for a in judged}
    return Segments(
        len(members),
        reference,
        curve,
        {a: ends[a] for a in judged},
        end_params,
        {a: outputs[a] for a in judged},
        end_outputs,
    )


def floor_spread(reference: Outcome | None, dtype: str) -> Spread | None:
    """The zeroth look's spread (harness/calibrate/roles.py ZEROTH): no member ran, s = 0
    everywhere, so every tolerance is its rounding floor alone. A tolerance grows with the
    spread, so a check that passes here passes on any members'; one that does not is judged
    on the first look's members (calibration.first_look). None unless the reference ran."""
    if reference is None or reference.status != "ok":
        return None
    return Spread(
        dtype=dtype,
        runs=0,
        curve=np.zeros(len(reference.losses)),
        initial_outputs=0.0,
        initial_loss=0.0,
        params={step: [0.0] * len(snapshot) for step, snapshot in reference.snapshots.items()},
        final_outputs=0.0,
        final_outputs_max=0.0,
        metrics=dict.fromkeys(reference.metrics, 0.0),
        around="the oracle" if reference.key.framework == ORACLE else replace(reference.key, variant="").label,
    )


def floor_segments(reference: dict[int, np.ndarray], ends: dict[int, Params] | None = None, outputs: dict[int, np.ndarray] | None = None) -> Segments:
    """The zeroth look's spread over each re-anchored segment (as floor_spread): the reference's
    losses over each (by the step it starts at), its tensors and outputs at each end where it
    kept them, and no member's distance from them."""
    ends, outputs = ends or {}, outputs or {}
    judged = [a for a in sorted(reference) if a in ends and a in outputs]
    return Segments(
        0,
        reference,
        {a: np.zeros(len(losses)) for a, losses in reference.items()},
        {a: ends[a] for a in judged},
        {a: dict.fromkeys(ends[a], 0.0) for a in judged},
        {a: outputs[a] for a in judged},
        dict.fromkeys(judged, 0.0),
    )


def tensors(params: Params) -> list[np.ndarray]:
    """Each tensor, in the network's order (problem.initial_params'), as a float64 array."""
    return [np.asarray(a, np.float64) for a in params.values()]


def relative_curve_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / np.maximum(np.abs(b), TINY)


def _l2(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)))


def measure(reference: Outcome | None, runs: list[Outcome | None], dtype: str) -> Spread | None:
    """The spread of `runs` (in plain unit order) around `reference`, over the steps every
    run kept finite where some diverged; None unless the reference ran and every run either
    ran or diverged after its first step."""
    if reference is None or reference.status != "ok" or not runs or any(r is None or not (r.status == "ok" or r.diverged) for r in runs):
        return None
    gone = {r.key.label: int(r.failed_at_step) for r in runs if r.status != "ok"}
    finite = min(gone.values(), default=len(reference.losses))
    if finite < 1:
        return None
    distance = np.max([relative_curve_distance(r.losses[:finite], reference.losses[:finite]) for r in runs], axis=0)
    # the parameters after step s are those the loss at step s was computed with
    steps = [s for s in reference.snapshots if (not gone or s < finite) and all(s in r.snapshots for r in runs)]
    params = {
        step: np.max(
            [[_l2(x, y) for x, y in zip(tensors(r.snapshots[step]), tensors(reference.snapshots[step]))] for r in runs],
            axis=0,
        ).tolist()
        for step in steps
    }
    return Spread(
        dtype=dtype,
        runs=len(runs),
        curve=np.maximum.accumulate(distance),
        initial_outputs=max(_l2(r.initial_outputs, reference.initial_outputs) for r in runs),
        initial_loss=max(abs(float(r.losses[0] - reference.losses[0])) for r in runs),
        params=params,
        final_outputs=np.inf if gone else max(_l2(r.final_outputs, reference.final_outputs) for r in runs),
        final_outputs_max=np.inf if gone else max(float(np.abs(r.final_outputs - reference.final_outputs).max()) for r in runs),
        metrics={} if gone else _metric_spread(reference, runs),
        around="the oracle" if reference.key.framework == ORACLE else replace(reference.key, variant="").label,
        diverged=gone,
    )


@dataclass(frozen=True)
class Calibration:
    """The spreads that set every tolerance of a spec's matrix."""

    float32: Spread | None  # the array-module float32 run and members against the oracle (a port's: torch's)
    float64: Spread | None  # the oracle's reordered members against the oracle, first steps
    twin_reference: Outcome | None = None  # the oracle over the twins' steps
    segments: Segments | None = None  # the re-anchored twins' members, over each segment
    anchored: dict[tuple[str, str], Outcome] = field(default_factory=dict)  # (framework, device) -> its re-anchored run
    # (framework, device) -> the oracle computing that library's formula (harness/inputs/library.py):
    # over the first steps, and re-anchored; that framework's twin is judged against them
    library: dict[tuple[str, str], tuple[Outcome, Outcome | None]] = field(default_factory=dict)
    # (framework, device) -> the spread of that library's formula, over the first steps and
    # re-anchored: its own reordered members around it. A formula can carry rounding further
    # than the spec's (SGD without dampening takes longer steps), so its twin is calibrated
    # on the dynamics it is judged on.
    library_spread: dict[tuple[str, str], tuple[Spread | None, Segments | None]] = field(default_factory=dict)
    # framework -> the float32 members computing its library's catalogued behaviours
    # (harness/known_differences.yaml), whole runs in plain unit order: how far a known
    # difference can carry that framework's float32 runs (diagnosis.reach)
    library32: dict[str, list[Outcome]] = field(default_factory=dict)
    # the run every other is judged against, and the float32 run whose members make the
    # envelope (harness/calibrate/roles.py Scheme): the oracle and numpy@cpu, or a port's
    # torch float64 and float32 runs
    reference: RunKey = ORACLE_KEY
    member: RunKey = CALIBRATION_KEY
    # framework -> the reference computing that library's formula over the whole run, in
    # float64: run only where a float32 check of that framework fails beyond what its float32
    # members reach (harness/calibrate/calibration.py library_whole; diagnosis.lying_with)
    library_whole: dict[str, Outcome] = field(default_factory=dict)
    # torch's autocast run and its members (its sums in other orders) against the reference:
    # the envelope every bf16 run is judged on (harness/calibrate/roles.py bf16_jobs)
    bf16: Spread | None = None

    @property
    def reference_name(self) -> str:
        """The reference in a check's prose: "the oracle", or its run's label."""
        return "the oracle" if self.reference.framework == ORACLE else self.reference.label

    def reference_of(self, twin: RunKey) -> Outcome | None:
        """What a twin's first steps are judged against: the oracle's, or the oracle
        computing the library's formula."""
        found = self.library.get((twin.framework, twin.device))
        return self.twin_reference if found is None else found[0]

    def spread_of(self, twin: RunKey) -> Spread | None:
        """The float64 spread a twin's first steps are calibrated on: the oracle's members',
        or those computing the library's formula where the twin is judged against it."""
        if (twin.framework, twin.device) not in self.library:
            return self.float64
        return self.library_spread.get((twin.framework, twin.device), (None, None))[0]

    def segments_of(self, twin: RunKey) -> Segments | None:
        """The re-anchored spread a twin is calibrated on (as spread_of, per segment)."""
        if (twin.framework, twin.device) not in self.library:
            return self.segments
        return self.library_spread.get((twin.framework, twin.device), (None, None))[1]


def _metric_spread(reference: Outcome, runs: list[Outcome]) -> dict[str, float]:
    """Each final metric's largest |difference| of a run's from the reference's."""
    return {m: max(abs(r.metrics[m] - value) for r in runs) for m, value in reference.metrics.items() if all(m in r.metrics for r in runs)}
