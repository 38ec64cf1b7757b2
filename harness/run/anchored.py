"""Re-anchored twins: math parity along the whole run.

The float64 twins compare each framework with the oracle over the run's first steps. A
math difference that starts later (a schedule one phase off, a decay at step 1,000, a bias
correction wrong at large t) is invisible there, and on a chaotic workload the float32
envelope cannot see it either. So at anchors along the run (Problem.anchors: every
`math_parity.every` steps) each framework's float64 twin starts again from the oracle's own
float64 state at that step (the network's tensors, the optimizer's moments or momentum
buffers, the update count and with it the schedule's position), trains
`math_parity.steps` steps, and is compared with the oracle's own steps from that state,
under the calibrated float64 rule: the float64 members start from the same state, in their
own unit order, and round otherwise over the segment. Each segment is short, so the rule
holds where float64 itself is chaotic over the whole run. At each segment's end every
tensor (batch-norm statistics too) and the probe's evaluation-mode outputs are judged as
well, against the oracle's own at that step: a difference in a buffer or in evaluation
alone changes no training loss.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from adapters.protocol import BuildsAgain, KeepsTrainingState, LoadsState
from harness.core.errors import described
from harness.core.registry import RunKey
from harness.inputs.members import in_member_order
from harness.inputs.problem import Params, Problem
from harness.run.runner import Outcome, prepared_adapter

ANCHORED = "anchored"  # the variant of a re-anchored run's key


def anchored_key(key: RunKey) -> RunKey:
    """The key of `key`'s re-anchored run (a twin's, or a float64 member's)."""
    return replace(key, variant=f"{key.variant}-{ANCHORED}" if key.variant else ANCHORED)


def member_states(states: dict[int, Params], member: Problem) -> dict[int, Params]:
    """The oracle's states in a calibration member's unit order."""
    return {a: in_member_order(state, member.unit_orders) for a, state in states.items()}


def segment_end(adapter, trainer, step: int) -> Params:
    """What a run carries at a segment's end: its whole training state (every tensor and the
    optimizer's moments by name) where the adapter gives one, else its tensors."""
    return adapter.training_state(trainer) if isinstance(adapter, KeepsTrainingState) else adapter.state(trainer, step).params


def run_segments(problem: Problem, key: RunKey, states: dict[int, Params]) -> Outcome:
    """Each segment [a, a + math_parity.steps) trained by `key`'s adapter from the state at
    step a, on a trainer of its own; the outcome's `segments` holds each one's losses,
    `segment_ends` and `segment_outputs` every tensor and the probe's evaluation-mode outputs
    at its end, its timings["train_s"] their training time together. A member's trainer
    rounds over its own segment's steps (Problem.jitter_from). Any other run's problem (a
    twin's, a reference's computing a library's formula) is the same at every anchor: where
    its adapter can (BuildsAgain), each segment's trainer is the first one's built again with
    its compiled step, and each is warmed up (compiled) before its training is timed, as every
    timed run's is. A segment that raises or diverges fails the run, with the reason."""
    adapter, reason = prepared_adapter(key)
    if reason:
        return Outcome(key, "skipped", reason)
    if not isinstance(adapter, LoadsState):
        return Outcome(key, "skipped", f"{key.framework}'s adapter cannot load a training state (adapters/protocol.py LoadsState)")
    outcome = Outcome(key, "ok", describe=adapter.describe(key))
    steps = problem.spec.checks.math_parity.steps
    try:
        data = adapter.put(problem, key)
        trainer, member = None, problem.jitter_seed is not None
        for start, state in sorted(states.items()):
            stop = min(start + steps, problem.total_steps)
            if trainer is not None and not member and isinstance(adapter, BuildsAgain):
                trainer = adapter.build_again(trainer)
            else:
                trainer = adapter.build(replace(problem, jitter_from=start), data, key)
            if not member:  # a member is warmed up as before: not at all (nothing it draws moves)
                adapter.warm_up(trainer)
            adapter.load_state(trainer, state, start)
            adapter.synchronize(trainer)
            began = time.perf_counter()
            adapter.train(trainer, start, stop)
            adapter.synchronize(trainer)
            outcome.timings["train_s"] = outcome.timings.get("train_s", 0.0) + time.perf_counter() - began
            losses = np.asarray(adapter.state(trainer, stop).losses[start:stop], np.float64)
            bad = np.flatnonzero(~np.isfinite(losses))
            if bad.size:
                return Outcome(key, "failed", f"diverged: non-finite loss at step {start + int(bad[0])}", failed_at_step=start + int(bad[0]))
            outcome.segments[start] = losses
            outcome.segment_ends[start] = segment_end(adapter, trainer, stop)
            outcome.segment_outputs[start] = adapter.predict(trainer, problem.probe)
    except Exception as exc:  # a framework error fails this run only
        detail = described(exc)
        return Outcome(key, "failed", f"{key.label} raised {detail}")
    return outcome


def segments_read(whole: Outcome, key: RunKey, steps: int) -> Outcome | None:
    """`key`'s re-anchored run read from the reference's whole run (a twin running the
    reference's own code, roles.same_code): each segment [a, a + `steps`) is that run's own
    steps from its state at a, which it kept at each segment's end with the probe's
    outputs (runner._Trial), so the segments a run of them from those states trains are
    these, bit for bit (tests/test_first_look.py). None where it kept no end for one of its
    anchors, or a segment's losses are not finite: that run then goes on its own."""
    starts = sorted(whole.anchor_states)
    if whole.losses is None or not starts or set(starts) != set(whole.segment_ends) or set(starts) != set(whole.segment_outputs):
        return None
    outcome = Outcome(key, "ok", describe=dict(whole.describe))
    for start in starts:
        losses = np.asarray(whole.losses[start : start + steps], np.float64)
        if len(losses) < steps or not np.isfinite(losses).all():
            return None
        outcome.segments[start] = losses
        outcome.segment_ends[start] = whole.segment_ends[start]
        outcome.segment_outputs[start] = whole.segment_outputs[start]
    return outcome
