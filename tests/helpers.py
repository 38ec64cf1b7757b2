"""Helpers shared by the test modules: the command line run in this process, its one-line
errors, small specs written to a folder, an Outcome with every field set, and Ctrl-C's
default action for a test's child process."""

from __future__ import annotations

import dataclasses
import math
import signal
from pathlib import Path

import numpy as np
import yaml

from harness import cli
from harness.core.paths import SPECS_DIR
from harness.core.registry import RunKey
from harness.run.runner import Outcome


def harness(capsys, *args: str) -> tuple[int, str, str]:
    """Run the command line in this process: its exit code, stdout and stderr."""
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], err


def tiny_moons(folder: Path, **changes) -> Path:
    """The moons spec shrunk to 64 points, 8 hidden units and 3 steps (a run takes ms)."""
    doc = yaml.safe_load((SPECS_DIR / "moons_net.yaml").read_text())
    doc["data"]["n_samples"] = 64
    doc["model"]["layers"][0]["width"] = 8
    doc["training"]["epochs"] = 3
    doc["checks"]["probe_size"] = 16
    doc["checks"]["params_after_steps"]["step"] = 2
    doc["logging"] = {"loss_every": 1, "print_every": 1}
    doc["profiles"], doc["known_differences"] = {}, []
    return write_spec(folder / "tiny_moons.yaml", doc, changes)


def write_spec(path: Path, doc: dict, changes: dict) -> Path:
    """`doc` with `changes` (key paths joined by "__", list indices as numbers) as YAML."""
    for dotted, value in changes.items():
        *parents, last = [int(k) if k.isdigit() else k for k in dotted.split("__")]
        section = doc
        for key in parents:
            section = section[key]
        section[last] = value
    path.write_text(yaml.safe_dump(doc))
    return path


def a_sample_outcome() -> Outcome:
    """An Outcome with every field, and every field of its key, set to a non-default value
    of its declared type."""
    rng = np.random.default_rng(0)

    def params():
        w, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
        return {"dense1.weight": w, "dense1.bias": b, "dense2.weight": w, "dense2.bias": b}

    key = RunKey("torch", "gpu", variant="order3", precision="tf32", mode="fast")
    sample = {
        "key": key,
        "status": "failed",
        "reason": "diverged at step 3",
        "describe": {"library": "torch", "threads": 2, "math_mode": {"tf32": "on"}, "nested": [1, 2.5, None, True]},
        "losses": np.array([1.0, 0.5, np.nan, np.inf], dtype=np.float32),
        "snapshots": {1: params(), 100: params()},
        "initial_outputs": rng.standard_normal((16, 2)),
        "final_outputs": rng.standard_normal((16, 2)).astype(np.float32),
        "final_params": params(),
        "metrics": {"train_loss": 0.25, "train_accuracy": 1.0},
        "timings": {"repeats": 2, "train_s": 1.5, "train_s_each": [1.5, 1.6], "alternated_with": ["torch@gpu"]},
        "repeats_bitwise_identical": False,
        "repeats_max_abs_diff": math.inf,
        "repeats_first_diff_step": 7,
        "failed_at_step": 3,
        "layer_outputs": {"conv1": rng.standard_normal((4, 2, 3, 3)), "dense1": rng.standard_normal((4, 5))},
        "anchor_states": {100: {**params(), "m/dense1.weight": rng.standard_normal((3, 4)), "v/dense1.weight": rng.standard_normal((3, 4))}},
        "segments": {100: rng.standard_normal(20), 200: rng.standard_normal(20)},
        "segment_ends": {100: {**params(), "m/dense1.weight": rng.standard_normal((3, 4))}},
        "segment_outputs": {100: rng.standard_normal((16, 2)), 200: rng.standard_normal((16, 2)).astype(np.float32)},
        "first_params": params(),
        "first_outputs": rng.standard_normal((16, 2)),
        "first_metrics": {"train_loss": 0.5, "train_accuracy": 0.75},
        "worker": {"hostname": "node-a", "node": "c143eb17c71b", "threads": 1, "fingerprint": {"CPU": ["x", 2], "GPUs": []}},
    }
    # A field added to Outcome or RunKey fails here until the sample (and the codec) has it.
    assert set(sample) == {f.name for f in dataclasses.fields(Outcome)}
    defaults = {f.name: f.default for f in dataclasses.fields(Outcome)}
    assert all(sample[name] is not defaults[name] for name in sample)
    assert all(getattr(key, f.name) != f.default for f in dataclasses.fields(RunKey) if f.default is not dataclasses.MISSING)
    return Outcome(**sample)


def interruptible() -> None:
    """In a test's child process, before it starts: Ctrl-C's default action, and SIGINT
    unblocked, whatever this process had. A job started in the background (`.ci/run &`)
    inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler; a mask
    is inherited across exec, and a test worker whose thread has SIGINT blocked (a library's
    threads can leave it so) hands its child a Ctrl-C that stays pending: the run went on
    to its end (exit 0) in CI, twice in one session. Without this no Ctrl-C test would mean
    anything."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
