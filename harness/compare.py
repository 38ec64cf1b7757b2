"""Regression checks: new records against a baseline (a folder, or results/ at a git revision).

Records are matched by spec, framework, device, profile, dtype and data source (the newest
of each in either set). A pair regresses when a check that passed now fails (an agreement error grew
past its tolerance, or a verdict flipped), when a final metric moved by more than its
tolerance, or when the time per step grew by more than the noise both sides recorded.
Records of different hosts or library versions are compared only when asked.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.errors import RecordError
from harness.gitrev import checked_revision
from harness.records import Record, read_record

# A time-per-step regression must exceed the spread of both sides' repeats, per step, plus
# this fraction of the baseline. Runs of a single repeat record no spread: their times are
# not judged (the oracle runs once; so do specs whose runs take minutes).
TIME_NOISE_FLOOR = 0.05
# Final metrics may move by this much relative, plus the spec's metric floor, before it
# counts (a bitwise-reproducible CPU run moves by exactly zero).
METRIC_RTOL = 1e-6


@dataclass(frozen=True)
class Finding:
    spec: str
    run: str
    profile: str
    what: str
    baseline: str
    new: str
    verdict: str  # ok, regression, improved, changed, not compared


def load_records(folder: Path) -> dict[tuple, Record]:
    """The newest record of each (spec, framework, device, profile, dtype, data source) under folder."""
    if not folder.is_dir():
        raise RecordError(f"{folder}: no such records folder")
    newest: dict[tuple, Record] = {}
    for path in sorted(folder.rglob("*.json")):
        if path.name == "schema.json":
            continue
        record = read_record(path)
        key = (record.spec.name, record.framework, record.device.kind, record.spec.profile, record.dtype, record.data.source)
        if key not in newest or record.created > newest[key].created:
            newest[key] = record
    return newest


def baseline_folder(baseline: str, workdir: Path) -> Path:
    """A folder as is, or `git:REV` (results/ as committed at REV), extracted into workdir."""
    if not baseline.startswith("git:"):
        return Path(baseline)
    rev = checked_revision(baseline.removeprefix("git:"), "--baseline", Path.cwd())
    archive = subprocess.run(["git", "archive", "--format=tar", "--end-of-options", rev, "results"], capture_output=True)
    if archive.returncode != 0:
        raise RecordError(f"{baseline}: cannot read results/ at that revision: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(workdir)], input=archive.stdout, check=True)
    return workdir / "results"


def _same_environment(a: Record, b: Record) -> str | None:
    if a.host.cpu_model != b.host.cpu_model or a.host.cores != b.host.cores:
        return f"different hosts ({b.host.cpu_model} vs {a.host.cpu_model})"
    if a.libraries != b.libraries:
        changed = sorted(k for k in set(a.libraries) | set(b.libraries) if a.libraries.get(k) != b.libraries.get(k))
        return f"different library versions ({', '.join(changed)})"
    return None


def compare_pair(base: Record, new: Record, across: bool) -> list[Finding]:
    spec, run, profile = new.spec.name, f"{new.framework}@{new.device.kind}", new.spec.profile

    def finding(what: str, b: str, n: str, verdict: str) -> Finding:
        return Finding(spec, run, profile, what, b, n, verdict)

    findings = []
    differs = _same_environment(base, new)
    if differs and not across:
        return [finding("everything", "", "", f"not compared: {differs} (--across-hosts)")]
    if differs:
        findings.append(finding("environment", "", "", f"compared across: {differs}"))
    if base.status != new.status:
        verdict = "regression" if base.status == "ok" else "improved" if new.status == "ok" else "changed"
        findings.append(finding("status", base.status, new.status, verdict))

    base_checks = {(c.name, c.against): c for c in base.checks}
    for check in new.checks:
        old = base_checks.get((check.name, check.against))
        if old is None or old.verdict == check.verdict:
            continue
        if check.verdict == "fail":
            verdict = "regression"
        elif old.verdict == "fail":
            verdict = "improved"
        else:
            verdict = "changed"
        err = "" if check.max_rel_error is None else f" (max rel {check.max_rel_error:.3g})"
        findings.append(finding(f"{check.name} vs {check.against}", old.verdict, check.verdict + err, verdict))

    if base.metrics and new.metrics:
        for name, old in base.metrics.values.items():
            value = new.metrics.values.get(name)
            if value is None:
                continue
            moved = abs(value - old)
            allowed = METRIC_RTOL * abs(old)
            verdict = "regression" if moved > allowed else "ok"
            findings.append(finding(f"final {name}", f"{old:.7g}", f"{value:.7g}", verdict))

    if base.timings and new.timings and min(base.timings.repeats, new.timings.repeats) < 2:
        findings.append(finding("time per step", "", "", "not compared: a single repeat records no spread"))
    elif base.timings and new.timings and base.timings.total_steps == new.timings.total_steps:
        steps = base.timings.total_steps
        noise = (base.timings.train_s_spread + new.timings.train_s_spread) / steps
        allowed = base.timings.per_step_s + noise + TIME_NOISE_FLOOR * base.timings.per_step_s
        grew = new.timings.per_step_s > allowed
        findings.append(
            finding(
                "time per step",
                f"{base.timings.per_step_s * 1e3:.4g} ms",
                f"{new.timings.per_step_s * 1e3:.4g} ms (limit {allowed * 1e3:.4g})",
                "regression" if grew else "ok",
            )
        )
    return findings


def compare(new_dir: Path, baseline: str, across: bool = False) -> list[Finding]:
    with tempfile.TemporaryDirectory() as tmp:
        base_records = load_records(baseline_folder(baseline, Path(tmp)))
    new_records = load_records(new_dir)
    findings = []
    for key, new in sorted(new_records.items()):
        base = base_records.get(key)
        if base is None:
            findings.append(Finding(key[0], f"{key[1]}@{key[2]}", key[3], "everything", "", "", "not compared: no baseline"))
            continue
        findings.extend(compare_pair(base, new, across))
    return findings
