"""The results schema, defined once here and exported to results/schema.json.

One record per run, made by harness/records/build.py, written by harness/records/write.py
and read by harness/records/store.py. Beside each record, an .npz holds the full loss curve
and the final parameters, named in the record with its sha256.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer

from harness.core.provenance import Frozen, Git, Host
from harness.core.registry import CheckVerdict
from harness.spec.fields import Name
from harness.verdict.bound import Bound

SCHEMA_VERSION = 1

# What a record says that becomes part of a path (its own file's, a report's figures'): a
# spec's, a profile's and a framework's name as a spec names them (harness/spec/fields.py
# Name), an id of 12 hex digits, a UTC time. A record that says otherwise ("../" in a name)
# is not a harness record.
PathName = Name
RecordId = Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]
Created = Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?\+00:00$")]


class PortRef(Frozen):
    """A user's port file (the spec's model.python) as the run read and ran it."""

    path: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    # the qualified names of its functions where they are not their roles' own names
    # (model.functions: harness.check_port's callables); a port file's records have none
    functions: dict[str, str] | None = None
    # where the port drops (torch's dropout modules and calls, flax's Dropouts): the run had
    # every one turned off, in both frameworks; none where it has no dropout
    dropout_off: list[str] | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        dumped = handler(self)
        for key in ("functions", "dropout_off"):
            if isinstance(dumped, dict) and dumped.get(key) is None:
                dumped.pop(key, None)
        return dumped


class SpecRef(Frozen):
    name: PathName
    path: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    profile: PathName
    overrides: dict[str, Any]
    port: PortRef | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        """A spec of layers has no port: its records are written as before ports existed."""
        dumped = handler(self)
        if isinstance(dumped, dict) and dumped.get("port") is None:
            dumped.pop("port", None)
        return dumped


class Device(Frozen):
    kind: Literal["cpu", "gpu"]
    name: str | None


class DataFile(Frozen):
    name: str
    sha256: str


class DataUsed(Frozen):
    source: str | None
    files: list[DataFile]
    n_train: int
    n_validation: int
    # the sha256 of every input the run read (data, initial tensors, batch order, masks:
    # harness/execute/jobs.py inputs_sha256), as the driver built them; a worker that rebuilt
    # other inputs refused the cell
    inputs_sha256: str | None = None


class Seeds(Frozen):
    data: int | None
    init: int
    shuffle: int


class Timings(Frozen):
    repeats: int
    total_steps: int
    cpu_threads: int | None
    data_prep_s: float
    transfer_s: float
    warmup_s: float
    # each repeat's warm-up: a framework that keeps its compiled code between repeats
    # (torch.compile) pays the compile in the first one only, which the median hides
    warmup_s_each: list[float] | None = None
    # the runs whose repeats took turns with this one's in one process (harness bench: eager
    # and fast of one framework and device), so that a drift in the machine's speed falls on
    # both; empty or absent: its repeats ran back to back
    alternated_with: list[str] | None = None
    train_s: float
    train_s_spread: float
    train_s_each: list[float]
    per_step_s: float
    # the share (0 to 1) of the host's CPU that went to other work while the repeats trained
    # (the median of the repeats'; harness/core/load.py): a slowdown a loaded host explains
    # is warned of, not failed (harness/gate/compare.py). Absent: not measured (not Linux;
    # records before 2026-11-26)
    others_cpu_share: Annotated[float, Field(ge=0, le=1)] | None = None


class FloorRecord(Frozen):
    """The hardware floor of one step (harness/hardware/floor.py) and this run against it."""

    flops_per_step: float
    bytes_per_step: float
    unfused_bytes_per_step: float
    launches_per_step: int
    matmul_flops_per_s: float
    bandwidth_bytes_per_s: float
    launch_latency_s: float | None
    rates_measured_with: str
    compute_s: float
    memory_s: float
    launch_s: float
    floor_s: float
    bound: Literal["arithmetic", "bandwidth", "launches"]
    measured_over_floor: float | None


class Curve(Frozen):
    steps: list[int]
    values: list[float]


class Metrics(Frozen):
    loss_curve: Curve
    final_loss: float
    values: dict[str, float]


class CheckRecord(Frozen):
    name: str
    against: str
    verdict: CheckVerdict
    tolerance: str
    max_abs_error: float | None
    max_rel_error: float | None
    first_failure_step: int | None
    horizon_steps: int | None
    reason: str | None
    # the error over its tolerance where it is largest (> 1 fails), the parameter tensor
    # where that is (dense1.weight, dense1.bias, ...; W1, b1, ... in records before
    # 2026-11-24), and for a failing or known check why (harness/verdict/diagnosis.py)
    ratio: float | None = None
    tensor: str | None = None
    diagnosis: str | None = None
    bound: Bound | None = None  # the tolerance as fields (verdict/checks.py); absent in records before 2026-11-24


class CalibrationRecord(Frozen):
    """The spreads the run's checks were judged by (harness/calibrate/spread.py): what a later
    comparison on another host may allow an honest float32 difference."""

    factor: float
    float32_runs: int
    float32_final_curve: float  # e(T): the members' final relative loss distance from the oracle
    float32_final_outputs: float  # the members' largest |difference| of a final output
    metric_floor: float  # the spec's long_run.metric_floor
    float64_runs: int | None
    twin_steps: int | None


class Artifact(Frozen):
    file: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*\.npz$", max_length=200)]  # beside the record, never a path
    sha256: str


class Worker(Frozen):
    """Where a run ran, when an executor ran it (harness/execute/executors.py): the machine's
    name and fingerprint, the Ray node, and the thread cap its cell ran under (None: the
    frameworks' own threads). A run's bits depend on its thread count."""

    hostname: str
    node: str | None = None
    threads: int | None = None
    fingerprint: dict[str, Any]


class OverSeedsRecord(Frozen):
    """A run's final metrics at each seed of a verdict over seeds (`harness run --seeds N`,
    harness/seeded.py): each seed's initial-weights seed, the first the spec's own, and per
    metric its value there (None where the run failed or diverged). `harness compare` judges
    two records' seeds by their distributions where their bits differ beyond the float32
    rule (harness/gate/compare.py)."""

    seeds: list[int]
    metrics: dict[str, list[float | None]]


class Record(Frozen):
    schema_version: Literal[1]
    record_id: RecordId
    run_id: str
    created: Created
    status: Literal["ok", "failed", "skipped"]
    reason: str | None
    spec: SpecRef
    framework: PathName
    implementation: str
    library_version: str | None
    device: Device
    dtype: Literal["float32", "float64"]
    # strict: full float32 products everywhere; tf32: TF32 allowed on the GPU (measured, not
    # gated); float64: the float64 twin of a framework's run (math parity against the oracle);
    # bf16: float32 parameters, bfloat16 computation where its library puts it (measured, not gated)
    precision_mode: Literal["strict", "tf32", "float64", "bf16"] = "strict"
    precision: dict[str, Any]
    # eager: the article-style code, one framework call per step; fast: the framework's
    # compiled mode (many steps per call, fused kernels, CUDA graphs)
    mode: Literal["eager", "fast"] = "eager"
    # a calibration member's variant (`order3`: its sums in another order); members are shown
    # in the terminal's table, not written
    variant: str = ""
    host: Host
    libraries: dict[str, str]
    git: Git
    seeds: Seeds
    data: DataUsed
    timings: Timings | None
    # the run this one's steps were read from, where it trained none of its own: NumPy's float64
    # twin is the oracle's own code, its first steps and segments the oracle's
    # (harness/calibrate/roles.py same_code); its timings are then absent
    read_from: str | None = None
    metrics: Metrics | None
    checks: list[CheckRecord]
    repeats_bitwise_identical: bool | None
    # Across the repeats of this run: the largest |difference| of the loss curve and final
    # parameters, and the first step whose loss differs (None when identical or one repeat).
    repeats_max_abs_diff: float | None = None
    repeats_first_diff_step: int | None = None
    failed_at_step: int | None
    artifacts: Artifact | None
    floor: FloorRecord | None = None
    calibration: CalibrationRecord | None = None
    worker: Worker | None = None
    # the run's final metrics at each seed, where it ran over seeds; absent otherwise (and in
    # every record written before 2026-12-07)
    over_seeds: OverSeedsRecord | None = None

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        dumped = handler(self)
        if isinstance(dumped, dict) and dumped.get("over_seeds") is None:
            dumped.pop("over_seeds", None)
        return dumped


def json_schema() -> str:
    schema = Record.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Reproducibility-harness run record"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
