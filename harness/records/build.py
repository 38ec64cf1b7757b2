"""Records, made in one place: one run's outcome, with its spec, problem, checks,
calibration and provenance, as the schema's Record (harness/records/schema.py) and the bytes
of its .npz."""

from __future__ import annotations

import numpy as np

from harness.calibrate.spread import Calibration
from harness.core.provenance import Provenance
from harness.core.registry import CALIBRATION_KEY, FLOAT32, FLOAT64, GPU_CALIBRATION_KEY, ORACLE, RunKey
from harness.hardware.floor import Floor
from harness.inputs.problem import Problem
from harness.records import schema
from harness.records.write import artifact_bytes, new_id, now
from harness.run.runner import Outcome
from harness.spec.load import LoadedSpec
from harness.verdict import checks as checks_mod
from harness.verdict.checks import Check


def implementation(key: RunKey, describe: dict) -> str:
    if key.framework == ORACLE:
        return f"array-module MLP on {'NumPy' if key.device == 'cpu' else 'CuPy (on the GPU)'}, float64 (reference oracle)"
    if key.precision == FLOAT64:
        read = f", read from {describe['read_from']}'s run (the same code)" if "read_from" in describe else ""
        return f"{describe.get('library', key.adapter)} adapter in float64: the float64 twin (math parity, first steps){read}"
    fast = f", fast mode: {describe['fast_mode']}" if "fast_mode" in describe else ""
    if key == GPU_CALIBRATION_KEY:
        return f"array-module MLP on CuPy, float32 (calibrates the envelope: the references ran on the GPU){fast}"
    if key.adapter == "numpy":
        calibrates = "; calibrates the envelope" if key == CALIBRATION_KEY else ""
        return f"array-module MLP on NumPy, float32 (the CuPy code's CPU path{calibrates}){fast}"
    return f"{describe.get('library', key.adapter)} adapter{fast}"


def floor_record(outcome: Outcome, f: Floor | None) -> schema.FloorRecord | None:
    """The step's floor on the run's device (harness/hardware/floor.py floor_of), and this run against it."""
    if f is None:
        return None
    rates = f.rates
    measured = outcome.timings.get("per_step_s") if outcome.status == "ok" and outcome.timings else None
    return schema.FloorRecord(
        flops_per_step=f.cost.flops,
        bytes_per_step=f.cost.bytes,
        unfused_bytes_per_step=f.cost.unfused_bytes,
        launches_per_step=f.cost.launches,
        matmul_flops_per_s=rates.matmul_flops_per_s,
        bandwidth_bytes_per_s=rates.bandwidth_bytes_per_s,
        launch_latency_s=rates.launch_latency_s,
        rates_measured_with=rates.measured_with,
        compute_s=f.compute_s,
        memory_s=f.memory_s,
        launch_s=f.launch_s,
        floor_s=f.floor_s,
        bound=f.bound,
        measured_over_floor=None if measured is None else measured / f.floor_s,
    )


def calibration_record(spec, cal: Calibration | None) -> schema.CalibrationRecord | None:
    if cal is None or cal.float32 is None or cal.float32.diverged:  # a member diverged: no final spread to record
        return None
    return schema.CalibrationRecord(
        factor=spec.checks.long_run.factor,
        float32_runs=cal.float32.runs,
        float32_final_curve=float(cal.float32.curve[-1]),
        float32_final_outputs=cal.float32.final_outputs_max,
        metric_floor=spec.checks.long_run.metric_floor,
        float64_runs=None if cal.float64 is None else cal.float64.runs,
        twin_steps=None if cal.twin_reference is None or cal.twin_reference.losses is None else len(cal.twin_reference.losses),
    )


# what a check's record copies from the check as it is (checks.Check)
CHECK_FIELDS = (
    "name",
    "verdict",
    "tolerance",
    "max_abs_error",
    "max_rel_error",
    "first_failure_step",
    "horizon_steps",
    "reason",
    "tensor",
    "diagnosis",
)


def build_record(
    loaded: LoadedSpec,
    problem: Problem,
    outcome: Outcome,
    checks: list[Check],
    cal: Calibration | None,
    run_id: str,
    provenance: Provenance,
    step_floor: Floor | None = None,
    inputs_sha256: str | None = None,
    over_seeds: tuple[list[int], dict[str, list[float | None]]] | None = None,
) -> tuple[schema.Record, bytes | None]:
    """The record of one run, from the spec, the problem, its outcome and the checks (those
    that involve the run are kept), the calibration that set their tolerances, and where it
    ran (asked once per run: core.provenance.collect), and the floor of its step on its
    device, where that was measured; its final metrics at each seed (`over_seeds`: the seeds'
    initial-weights seeds and each metric's values), where it ran over seeds."""
    key, spec = outcome.key, loaded.spec
    metrics = None  # and none where the run computed none (math parity's members: harness/execute/jobs.py)
    if outcome.losses is not None and outcome.status == "ok" and "train_loss" in outcome.metrics:
        every = spec.logging.loss_every
        steps = list(range(0, len(outcome.losses), every))
        if steps[-1] != len(outcome.losses) - 1:
            steps.append(len(outcome.losses) - 1)
        metrics = schema.Metrics(
            loss_curve=schema.Curve(steps=steps, values=[float(outcome.losses[s]) for s in steps]),
            final_loss=outcome.metrics["train_loss"],
            values=outcome.metrics,
        )
    timings = None
    if outcome.timings:
        timings = schema.Timings(cpu_threads=outcome.describe.get("threads"), **outcome.timings)
    kept = [
        schema.CheckRecord(
            **{name: getattr(c, name) for name in CHECK_FIELDS},
            against=c.other(key).label,
            ratio=None if c.ratio is None or c.ratio == float("inf") else c.ratio,
            bound=c.bound,
        )
        for c in checks
        if c.involves(key)
    ]
    data = spec.data
    record = schema.Record(
        schema_version=schema.SCHEMA_VERSION,
        record_id=new_id(),
        run_id=run_id,
        created=now(),
        status=outcome.status,
        reason=outcome.reason,
        spec=schema.SpecRef(
            name=spec.name,
            path=str(loaded.path),
            sha256=loaded.sha256,
            profile=loaded.profile,
            overrides=loaded.overrides,
            port=None
            if loaded.port is None
            else schema.PortRef(
                path=str(loaded.port),
                sha256=loaded.port_sha256,
                functions=loaded.spec.model.functions,
                dropout_off=list(problem.port_dropout) or None,
            ),
        ),
        framework=key.framework,
        implementation=implementation(key, outcome.describe),
        read_from=outcome.describe.get("read_from"),
        library_version=outcome.describe.get("version"),
        device=schema.Device(kind=key.device, name=outcome.describe.get("device_name")),
        dtype=key.dtype,
        precision_mode=key.precision,
        precision=outcome.describe.get("math_mode", {}),
        mode=key.mode,
        variant=key.variant,
        host=provenance.host,
        worker=schema.Worker(**outcome.worker) if outcome.worker else None,
        over_seeds=None if over_seeds is None else schema.OverSeedsRecord(seeds=over_seeds[0], metrics=over_seeds[1]),
        libraries=provenance.libraries,
        git=provenance.git,
        seeds=schema.Seeds(
            data=getattr(data, "seed", getattr(data, "split_seed", None)),
            init=spec.init.seed,
            shuffle=spec.training.shuffle_seed,
        ),
        data=schema.DataUsed(
            source=problem.data_source,
            files=[schema.DataFile(name=f.name, sha256=f.sha256) for f in problem.data_files],
            n_train=len(problem.x_train),
            n_validation=0 if problem.x_val is None else len(problem.x_val),
            inputs_sha256=inputs_sha256,
        ),
        timings=timings,
        metrics=metrics,
        checks=kept,
        repeats_bitwise_identical=outcome.repeats_bitwise_identical,
        repeats_max_abs_diff=outcome.repeats_max_abs_diff,
        repeats_first_diff_step=outcome.repeats_first_diff_step,
        failed_at_step=outcome.failed_at_step,
        artifacts=None,
        floor=floor_record(outcome, step_floor),
        calibration=calibration_record(spec, cal),
    )
    artifact = None
    if outcome.losses is not None:
        artifact = artifact_bytes(outcome.losses, outcome.final_params, envelope_curve(spec, cal, key))
    return record, artifact


def envelope_curve(spec, cal: Calibration | None, key: RunKey) -> np.ndarray | None:
    """The relative loss tolerance per step that judged a float32 run's curve against any
    other's: factor * e(t) + curve_floor (checks.envelope_checks); None for a float64 run."""
    if cal is None or cal.float32 is None or cal.float32.diverged or key.dtype != FLOAT32:  # diverged: the checks say how far it judged
        return None
    return checks_mod.envelope(spec, cal.float32)
