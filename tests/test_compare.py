"""The regression gate: the committed CPU baseline passes against itself, and perturbed
copies of it (a larger error, a slower time, a flipped verdict, a moved metric) are caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import compare
from harness.errors import RecordError
from tests.conftest import ROOT

BASELINE = ROOT / "baselines" / "cpu-quick"


def copy_baseline(tmp_path: Path) -> Path:
    target = tmp_path / "new"
    shutil.copytree(BASELINE, target)
    return target


def edit_one(folder: Path, framework: str, change) -> None:
    path = next(p for p in sorted(folder.rglob(f"*_{framework}_cpu_*.json")))
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def verdicts(findings) -> list[str]:
    return [f.verdict for f in findings]


def test_baseline_exists_and_identical_records_pass(tmp_path):
    assert len(list(BASELINE.rglob("*.json"))) >= 8
    findings = compare.compare(copy_baseline(tmp_path), str(BASELINE))
    assert "regression" not in verdicts(findings)
    assert any(f.what == "time per step" for f in findings) and any(f.what.startswith("final ") for f in findings)


def flip_first_passing(doc):
    check = next(c for c in doc["checks"] if c["verdict"] == "pass")
    check["verdict"], check["max_rel_error"] = "fail", (check["max_rel_error"] or 0) * 100 + 1


def slower(doc):
    # Ten times: the tiny quick runs record a spread of up to ~60% between repeats.
    doc["timings"]["per_step_s"] *= 10
    doc["timings"]["train_s"] *= 10


def metric_moved(doc):
    doc["metrics"]["values"]["train_loss"] *= 1.01


@pytest.mark.parametrize(
    "change, what",
    [(flip_first_passing, " vs "), (slower, "time per step"), (metric_moved, "final train_loss")],
)
def test_perturbed_records_are_caught(tmp_path, change, what):
    new = copy_baseline(tmp_path)
    edit_one(new, "torch", change)
    regressions = [f for f in compare.compare(new, str(BASELINE)) if f.verdict == "regression"]
    assert regressions and all(f.run == "torch@cpu" and what in f.what for f in regressions)


def test_time_within_the_recorded_noise_is_not_a_regression(tmp_path):
    new = copy_baseline(tmp_path)
    edit_one(new, "torch", lambda d: d["timings"].update(per_step_s=d["timings"]["per_step_s"] * 1.03))
    assert "regression" not in verdicts(compare.compare(new, str(BASELINE)))


def test_other_hosts_are_compared_only_when_asked(tmp_path):
    new = copy_baseline(tmp_path)
    for path in new.rglob("*.json"):
        doc = json.loads(path.read_text())
        doc["host"]["cpu_model"] = "Some Other CPU"
        doc["timings"]["per_step_s"] *= 3
        path.write_text(json.dumps(doc))
    skipped = compare.compare(new, str(BASELINE))
    assert all(f.verdict.startswith("not compared: different hosts") for f in skipped)
    across = compare.compare(new, str(BASELINE), across=True)
    assert any(f.verdict.startswith("compared across") for f in across) and "regression" in verdicts(across)


def test_the_cli_exits_one_on_a_regression_and_two_on_a_foreign_record(tmp_path):
    new = copy_baseline(tmp_path)
    ok = subprocess.run([sys.executable, "-m", "harness", "compare", str(new), "--baseline", str(BASELINE)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    edit_one(new, "jax", slower)
    bad = subprocess.run([sys.executable, "-m", "harness", "compare", str(new), "--baseline", str(BASELINE)], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and "1 regression(s)" in bad.stdout
    (new / "foreign.json").write_text('{"not": "a record"}')
    foreign = subprocess.run([sys.executable, "-m", "harness", "compare", str(new), "--baseline", str(BASELINE)], capture_output=True, text=True, cwd=ROOT)
    assert foreign.returncode == 2 and "not a harness record" in foreign.stderr


def test_missing_baseline_folder_is_an_error(tmp_path):
    with pytest.raises(RecordError, match="no such records folder"):
        compare.compare(copy_baseline(tmp_path), str(tmp_path / "nowhere"))


def test_single_repeat_times_are_not_judged(tmp_path):
    new = copy_baseline(tmp_path)
    edit_one(new, "oracle", slower)
    findings = [f for f in compare.compare(new, str(BASELINE)) if f.run == "oracle@cpu" and f.what == "time per step"]
    assert findings and all(f.verdict.startswith("not compared: a single repeat") for f in findings)
