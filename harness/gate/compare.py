"""Regression checks: new records against a baseline (a folder, or results/ at a git revision).

Records are matched cell by cell: spec, profile and its overrides (a sweep's size), data
source and size, framework, device, precision mode, dtype and mode (the newest of each in
either set). The verdicts are the harness's own:

- Every check the new record carries (against the oracle and the other runs of its
  matrix, math parity for a float64 twin) must pass or be known: a failing check is a
  regression, with its diagnosis.
- On the same host fingerprint (CPU model and flags, BLAS kernels, library versions) a
  CPU run is expected to be bitwise identical to its baseline; where it is not, that is
  said. On another fingerprint, an honest float32 difference is expected: each final metric
  may move by the calibrated rule, factor * e(T) * |baseline| + the metric floor (e(T) the
  larger of both records' float32 spread), and more is a regression.
- Time per step is compared only on the same fingerprint, and must grow by more than the
  noise both sides recorded. A growth the host explains (other work took a share of its CPU
  while the run was timed, or its rates measured slower in as large a ratio) is a warning,
  not a regression: a loaded machine is not a slower code.
"""

from __future__ import annotations

import io
import math
import tarfile
import tempfile
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from harness.core.errors import RecordError
from harness.core.git import checked_revision, folder_at
from harness.core.paths import REFERENCE_DIR
from harness.core.provenance import fingerprint
from harness.core.registry import LEAST_SEEDS, MEASURED, Cell, CheckVerdict
from harness.gate.consistency import record_problems
from harness.records import store
from harness.records.schema import Record
from harness.report.rows import gating, ms
from harness.verdict import seeds
from harness.verdict.bound import times_tolerance

# A time-per-step regression must exceed the spread of both sides' repeats, per step, plus
# this fraction of the baseline: the speed of the 2-core VMs this gate runs on drifts by up
# to 1.5x within minutes (measured; DEVELOPERS.md), so less than that is the machine, not
# the code. Runs of a single repeat record no spread: their times are not judged (the
# oracle runs once; so do specs whose runs take minutes).
TIME_NOISE_FLOOR = 0.5
# A slower time is the host's, not the code's, where other work took at least this share of
# the host's CPU while the run was timed (records' timings.others_cpu_share, harness/core/load.py):
# a quarter is a core of a 4-core host busy, half of the 2-core VMs', where a torch run that
# spreads its threads over every core waits on the busy one.
LOADED_SHARE = 0.25
WARNING = "warning"
NOT_COMPARED = "not compared"
NO_BASELINE = f"{NOT_COMPARED}: no baseline"
QUICK_BASELINE = Path("baselines/cpu-quick")  # the committed baseline of the quick profile (nox -s regress)
NOT_JUDGED = "not judged"
# A finding on a cell measured, not gated (a bf16 or TF32 run, or a check over seeds:
# registry.MEASURED, rows.gating): said, as the verdict says its failing checks, and no
# regression. Its final metrics are not held to the float32 rule either, which bf16 rounding
# on another host's kernels can exceed.
MEASURED_ONLY = f"{WARNING}: measured, not gated"
# A chaotic final metric both records ran over seeds, and whose distributions agree (_over_seeds)
SAME_OVER_SEEDS = "ok: the same distribution over seeds"


@dataclass(frozen=True)
class Finding:
    spec: str
    run: str
    profile: str
    what: str
    baseline: str
    new: str
    verdict: str  # ok, regression, improved, changed, not compared


def run_labels(records: list[Record]) -> dict[str, str]:
    """Each record's run label (by record id), with its number of training examples where
    runs of one spec and profile share a label (the points of a sweep)."""
    shared = Counter((r.spec.name, r.spec.profile, store.run_label(r)) for r in records)
    return {
        r.record_id: store.run_label(r) + (f" n={r.data.n_train}" if shared[(r.spec.name, r.spec.profile, store.run_label(r))] > 1 else "")
        for r in records
    }


def newest_in(folder: Path) -> dict[Cell, Record]:
    """The newest record of each cell (store.cell_of) under folder."""
    if not folder.is_dir():
        raise RecordError(f"{folder}: no such records folder")
    return store.newest(store.read(p) for p in store.record_paths(folder))


def baseline_folder(baseline: str, workdir: Path) -> Path:
    """A folder as is, or `git:REV` (the reference records, results/, as committed at REV),
    extracted into workdir."""
    if not baseline.startswith("git:"):
        return Path(baseline)
    rev = checked_revision(baseline.removeprefix("git:"), "--baseline", Path.cwd())
    folder = REFERENCE_DIR.as_posix()
    archive = folder_at(rev, folder, root=Path.cwd())
    if archive is None:
        raise RecordError(f"{baseline}: cannot read {folder}/ at that revision")
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(workdir, filter="data")  # no links out, no absolute paths, no devices
    except (tarfile.TarError, OSError) as exc:
        raise RecordError(f"{baseline}: cannot unpack {folder}/ at that revision: {exc}") from None
    return workdir / folder


def fingerprint_differences(a: Record, b: Record) -> list[str]:
    """What differs between the two records' host fingerprints (records.fingerprint; empty:
    the same), part by part; for libraries, which."""
    old, new = fingerprint(a.host, a.libraries), fingerprint(b.host, b.libraries)
    differs = []
    for part in old:
        if old[part] == new[part]:
            continue
        if part == "CPU":
            differs.append(f"CPU ({b.host.cpu_model} vs {a.host.cpu_model})")
        elif part == "library versions":
            changed = sorted(k for k in set(a.libraries) | set(b.libraries) if a.libraries.get(k) != b.libraries.get(k))
            differs.append(f"library versions ({', '.join(changed)})")
        else:
            differs.append(part)
    threads = [r.worker.threads if r.worker else None for r in (a, b)]
    if threads[0] != threads[1]:  # a run's bits depend on its thread count (harness/execute/executors.py)
        said = ["default" if t is None else str(t) for t in threads]
        differs.append(f"thread cap ({said[1]} vs {said[0]})")
    return differs


def _bitwise_same(base: Record, new: Record) -> bool:
    if not (base.metrics and new.metrics):
        return False
    return base.metrics.values == new.metrics.values and base.metrics.loss_curve == new.metrics.loss_curve


def _metric_findings(base: Record, new: Record, finding) -> list[Finding]:
    cals = [r.calibration for r in (base, new) if r.calibration is not None]
    if len(cals) < 2:
        return [finding("final metrics", "", "", "not compared: a record without calibration (re-record the baseline)")]
    factor = max(c.factor for c in cals)
    spread = max(c.float32_final_curve for c in cals)
    floor = max(c.metric_floor for c in cals)
    findings, chaotic = [], []
    for name, old in base.metrics.values.items():
        value = new.metrics.values.get(name)
        if value is None:
            findings.append(finding(f"final {name}", f"{old:.7g}", "missing", "regression"))
            continue
        allowed = factor * spread * abs(old) + floor
        if abs(value - old) > allowed:
            verdict = "regression"
        elif allowed >= abs(old):  # an allowance as large as the value itself can catch nothing
            verdict = f"{NOT_JUDGED}: chaotic beyond the float32 horizon (allowed {allowed:.3g} on a value of {abs(old):.3g})"
            chaotic.append(len(findings))
        else:
            verdict = "ok"
        findings.append(finding(f"final {name}", f"{old:.7g}", f"{value:.7g} (allowed {allowed:.3g})", verdict))
    return _over_seeds(base, new, findings, chaotic)


def _over_seeds(base: Record, new: Record, findings: list[Finding], chaotic: list[int]) -> list[Finding]:
    """The chaotic metrics (findings at `chaotic`, not judged by the float32 rule) judged by
    their distributions where both records ran over the same seeds (`harness run --seeds N`):
    each seed's new value against the baseline's, paired, as the verdict over seeds judges two
    frameworks (harness/verdict/seeds.py OverSeeds, its 0.05 shared among them). Measured,
    not gated, as the verdict's checks over seeds are: a difference is a warning."""
    if base.over_seeds is None or new.over_seeds is None:
        return findings
    common = [s for s in new.over_seeds.seeds if s in base.over_seeds.seeds]
    rows = {}
    for at in chaotic:
        name = findings[at].what.removeprefix("final ")
        if len(common) >= LEAST_SEEDS and name in base.over_seeds.metrics and name in new.over_seeds.metrics:
            now, old = _at_seeds(new, name, common), _at_seeds(base, name, common)
            rows[at] = seeds.OverSeeds(name, store.run_key(new), store.run_key(base), tuple(common), now, old)
    for at, row in rows.items():
        check = row.judged(seeds.SEEDS_ALPHA / len(rows), len(rows))
        if check.verdict == CheckVerdict.SKIPPED:
            continue
        said = f"over {row.n} seeds: the paired differences' mean {row.mean_difference:+.3g}, their spread {row.spread:.3g}"
        said += f", detectable {check.bound.allowed:.3g}"
        if check.verdict == CheckVerdict.FAIL:
            findings[at] = replace(findings[at], new=f"{findings[at].new}; {said}; {check.diagnosis}", verdict=MEASURED_ONLY)
        else:
            findings[at] = replace(findings[at], new=f"{findings[at].new}; {said}", verdict=SAME_OVER_SEEDS)
    return findings


def _at_seeds(record: Record, name: str, common: list[int]) -> tuple[float, ...]:
    """A record's final `name` at each of `common` seeds (NaN where its run had none)."""
    values = record.over_seeds.metrics[name]
    return tuple(math.nan if v is None else v for v in (values[record.over_seeds.seeds.index(s)] for s in common))


def loaded_host(base: Record, new: Record) -> str | None:
    """Why the host, not the code, may explain a slower time: other work took at least
    LOADED_SHARE of its CPU while the new run was timed (and more than while the baseline
    was); or the host's rates, measured before the run (its floor), were slower than the
    baseline's in at least the ratio of the times. None: nothing explains it."""
    old_share, share = base.timings.others_cpu_share, new.timings.others_cpu_share
    if share is not None and share >= LOADED_SHARE and share > (old_share or 0.0):
        was = "" if old_share is None else f", {old_share:.0%} while the baseline's was"
        return f"a loaded host: other work took {share:.0%} of its CPU while this run was timed{was}"
    if base.floor is None or new.floor is None:
        return None
    slower = {
        "matmul": base.floor.matmul_flops_per_s / new.floor.matmul_flops_per_s,
        "bandwidth": base.floor.bandwidth_bytes_per_s / new.floor.bandwidth_bytes_per_s,
    }
    rate, ratio = max(slower.items(), key=lambda item: item[1])
    if ratio > 1 and new.timings.per_step_s <= ratio * base.timings.per_step_s * (1 + TIME_NOISE_FLOOR):
        return f"a slower host: its {rate} rate measured {ratio:.3g}x slower than the baseline's, as much as the time grew"
    return None


def _time_findings(base: Record, new: Record, differs: list[str], finding) -> list[Finding]:
    if not (base.timings and new.timings):
        return []
    if differs:
        return [finding("time per step", "", "", f"not compared: another host fingerprint ({'; '.join(differs)})")]
    if min(base.timings.repeats, new.timings.repeats) < 2:
        return [finding("time per step", "", "", "not compared: a single repeat records no spread")]
    if base.timings.total_steps != new.timings.total_steps:
        return []
    steps = base.timings.total_steps
    noise = (base.timings.train_s_spread + new.timings.train_s_spread) / steps
    allowed = base.timings.per_step_s + noise + TIME_NOISE_FLOOR * base.timings.per_step_s
    verdict = "ok"
    if new.timings.per_step_s > allowed:
        explained = loaded_host(base, new)
        verdict = "regression" if explained is None else f"{WARNING}: {explained}; time not judged (rerun on an idle host)"
    return [finding("time per step", f"{ms(base.timings.per_step_s, 4)} ms", f"{ms(new.timings.per_step_s, 4)} ms (limit {ms(allowed, 4)})", verdict)]


def compare_pair(base: Record, new: Record, run: str | None = None) -> list[Finding]:
    spec, run, profile = new.spec.name, run or store.run_label(new), new.spec.profile

    def finding(what: str, b: str, n: str, verdict: str) -> Finding:
        return Finding(spec, run, profile, what, b, n, verdict)

    findings = []
    differs = fingerprint_differences(base, new)
    if base.status != new.status:
        verdict = "regression" if base.status == "ok" else "improved" if new.status == "ok" else "changed"
        findings.append(finding("status", base.status, new.status, verdict))

    for problem in record_problems(new):
        findings.append(finding("the record itself", "", problem, "regression"))
    new_checks = {(c.name, c.against) for c in new.checks}
    for check in base.checks:
        if (check.name, check.against) not in new_checks and new.status == "ok":
            findings.append(finding(f"{check.name} vs {check.against}", check.verdict, "missing", "regression"))
    base_checks = {(c.name, c.against): c for c in base.checks}
    for check in new.checks:
        old = base_checks.get((check.name, check.against))
        old_verdict = "-" if old is None else old.verdict
        err = "" if check.ratio is None else f" ({times_tolerance(check.ratio)})"
        if check.verdict == CheckVerdict.FAIL:
            failed = f"fail{err}; diagnosis: {check.diagnosis}"
            findings.append(finding(f"{check.name} vs {check.against}", old_verdict, failed, "regression" if gating(new, check) else MEASURED_ONLY))
        elif old is not None and old.verdict == CheckVerdict.FAIL:
            findings.append(finding(f"{check.name} vs {check.against}", "fail", check.verdict + err, "improved"))

    if base.metrics and new.metrics:
        same = not differs and _bitwise_same(base, new)
        if not differs:
            findings.append(
                finding(
                    "bitwise identity (same host fingerprint)",
                    "",
                    "identical" if same else "differs",
                    "ok" if same else "changed: expected bitwise identical on the same host and versions; judged by the calibrated rule",
                )
            )
        else:
            findings.append(finding("host fingerprint", "", "; ".join(differs), "changed: judged by the calibrated rule"))
        if not same:
            moved = _metric_findings(base, new, finding)
            measured = new.precision_mode in MEASURED  # its envelope's, not float32's: the rule below is float32's
            findings.extend(replace(f, verdict=MEASURED_ONLY) if measured and f.verdict == "regression" else f for f in moved)
    return [*findings, *_time_findings(base, new, differs, finding)]


def compare(new_dir: Path, baseline: str) -> list[Finding]:
    with tempfile.TemporaryDirectory() as tmp:
        base_records = newest_in(baseline_folder(baseline, Path(tmp)))
    new_records = newest_in(new_dir)
    labels = run_labels(list(new_records.values()))
    findings = []
    for key, new in sorted(new_records.items()):
        base = base_records.get(key)
        if base is None:
            findings.append(Finding(new.spec.name, labels[new.record_id], new.spec.profile, "everything", "", "", NO_BASELINE))
            continue
        findings.extend(compare_pair(base, new, labels[new.record_id]))
    run_matrices = {_matrix(r) for r in new_records.values()}
    for key, base in sorted(base_records.items()):
        if key not in new_records and _matrix(base) in run_matrices:  # a run that stopped running
            findings.append(Finding(base.spec.name, store.run_label(base), base.spec.profile, "the whole run", base.status, "missing", "regression"))
    return findings


def _matrix(record: Record) -> tuple[str, str, str | None]:
    """The run a record's cell belongs to, as far as a baseline's cell the new records lack
    is a run that stopped running: its spec and profile, and for a cell measured, not gated
    (bf16, TF32), its precision too: records made without `--precisions ...,bf16` asked for
    no bf16 cell, and lack none."""
    return record.spec.name, record.spec.profile, record.precision_mode if record.precision_mode in MEASURED else None


def profiles(records: dict[Cell, Record]) -> str:
    """Which specs each profile holds in a set of records: `full: mnist_mlp, peaks_mlp`."""
    held = sorted({(r.spec.profile, r.spec.name) for r in records.values()})
    by_profile: dict[str, list[str]] = {}
    for profile, name in held:
        by_profile.setdefault(profile, []).append(name)
    return "; ".join(f"{profile}: {', '.join(names)}" for profile, names in by_profile.items()) or "nothing"


def holdings(new_dir: Path, baseline: str) -> str:
    """What each side holds, for a comparison that matched nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        base = profiles(newest_in(baseline_folder(baseline, Path(tmp))))
    new = profiles(newest_in(new_dir))
    hint = ""
    if QUICK_BASELINE.is_dir() and "quick:" in new and "quick:" not in base:
        hint = f"; quick records compare with --baseline {QUICK_BASELINE}"
    return f"{new_dir} holds {new}; {baseline} holds {base}{hint}"


def summary(findings: list[Finding]) -> list[str]:
    """One line per regression, change or improvement; each other host fingerprint and each
    metric not judged said once; counts for the rest."""
    lines, said, counts = [], set(), Counter()
    not_judged = Counter((f.spec, f.profile, f.what) for f in findings if f.verdict.startswith(NOT_JUDGED))
    for f in findings:
        if f.verdict.startswith(WARNING):
            lines.append(f"WARNING {f.spec} {f.run} ({f.profile}): {f.what}: {f.baseline or '-'} -> {f.new}: {f.verdict.split(': ', 1)[1]}")
        elif f.verdict in ("regression", "improved") or f.verdict.startswith("changed") and f.what != "host fingerprint":
            head = f.verdict.split(":")[0].upper()
            lines.append(f"{head} {f.spec} {f.run} ({f.profile}): {f.what}: {f.baseline or '-'} -> {f.new}")
        elif f.what == "host fingerprint" and f.new not in said:
            said.add(f.new)
            lines.append(f"another host fingerprint than the baseline's ({f.new}): bits judged by the calibrated rule, times not compared")
        elif f.verdict == SAME_OVER_SEEDS:
            lines.append(f"OVER SEEDS {f.spec} {f.run} ({f.profile}): {f.what}: {f.baseline} -> {f.new}: the same distribution")
        elif f.verdict == NO_BASELINE:
            lines.append(f"NO BASELINE {f.spec} {f.run} ({f.profile}): not compared, the baseline has no such run")
        elif f.verdict.startswith(NOT_JUDGED):
            key = (f.spec, f.profile, f.what)
            if key not in said:
                said.add(key)
                lines.append(f"NOT JUDGED {f.spec} ({f.profile}) {f.what}, {not_judged[key]} run(s): {f.verdict.split(': ', 1)[1]}")
        counts[f.verdict.split(":")[0]] += 1
    tally = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()))
    return [*lines, f"findings: {tally}"]
