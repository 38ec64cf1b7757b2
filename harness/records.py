"""The results schema, defined once here and exported to results/schema.json.

One record per run. Every record is validated before it is written, written atomically
(a temporary file linked into place) and never overwritten. Beside each record, an .npz
holds the full loss curve and the final parameters, named in the record with its sha256.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import uuid
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.errors import RecordError

SCHEMA_VERSION = 1
PROJECT_ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("numpy", "pydantic", "pyyaml", "torch", "jax", "jaxlib", "optax", "cupy-cuda12x", "cupy-cuda13x")


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpecRef(Frozen):
    name: str
    path: str
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    profile: str
    overrides: dict[str, Any]


class Device(Frozen):
    kind: Literal["cpu", "gpu"]
    name: str | None


class Host(Frozen):
    hostname: str
    cpu_model: str
    cores: int
    os: str
    python: str
    # The BLAS libraries loaded in the writing process and the kernels they chose for this
    # CPU ("openblas 0.3.31 SkylakeX"): NumPy's float32 and float64 bits depend on them, and
    # on a VM that moves between CPUs they change under the same code.
    blas: list[str] = []
    cpu_flags: str | None = None  # sha256 (16 hex) of the CPU's feature flags: kernels follow them


class Git(Frozen):
    commit: str | None
    dirty: bool | None


class DataFile(Frozen):
    name: str
    sha256: str


class DataUsed(Frozen):
    source: str | None
    files: list[DataFile]
    n_train: int
    n_validation: int


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


class FloorRecord(Frozen):
    """The hardware floor of one step (harness/floor.py) and this run against it."""

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
    verdict: Literal["pass", "fail", "known", "skipped"]
    tolerance: str
    max_abs_error: float | None
    max_rel_error: float | None
    first_failure_step: int | None
    horizon_steps: int | None
    reason: str | None
    # the error over its tolerance where it is largest (> 1 fails), the parameter tensor
    # where that is (W1, b1, ...), and for a failing or known check why (harness/diagnosis.py)
    ratio: float | None = None
    tensor: str | None = None
    diagnosis: str | None = None


class CalibrationRecord(Frozen):
    """The spreads the run's checks were judged by (harness/calibration.py): what a later
    comparison on another host may allow an honest float32 difference."""

    factor: float
    float32_runs: int
    float32_final_curve: float  # e(T): the members' final relative loss distance from the oracle
    float32_final_outputs: float  # the members' largest |difference| of a final output
    metric_floor: float  # the spec's long_run.metric_floor
    float64_runs: int | None
    twin_steps: int | None


class Artifact(Frozen):
    file: str
    sha256: str


class Record(Frozen):
    schema_version: Literal[1]
    record_id: str
    run_id: str
    created: str
    status: Literal["ok", "failed", "skipped"]
    reason: str | None
    spec: SpecRef
    framework: str
    implementation: str
    library_version: str | None
    device: Device
    dtype: Literal["float32", "float64"]
    # strict: full float32 products everywhere; tf32: TF32 allowed on the GPU (measured, not
    # gated); float64: the float64 twin of a framework's run (math parity against the oracle)
    precision_mode: Literal["strict", "tf32", "float64"] = "strict"
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


# Where a user's runs go by default (git-ignored), and where the committed reference
# records live, from which the report is built.
RUNS_DIR = Path("runs")
REFERENCE_DIR = Path("results")


def json_schema() -> str:
    schema = Record.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Reproducibility-harness run record"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


# --- facts about the machine -----------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                return hashlib.sha256(flags.encode()).hexdigest()[:16]
    except OSError:
        pass
    return None


def host_info() -> Host:
    return Host(
        hostname=platform.node(),
        cpu_model=_cpu_model(),
        cpu_flags=_cpu_flags(),
        cores=os.cpu_count() or 0,
        os=platform.platform(),
        python=platform.python_version(),
        blas=_blas(),
    )


def fingerprint(host: Host, libraries: dict[str, str]) -> dict[str, Any]:
    """What a run's numbers and timings depend on in a host, without its name, part by part:
    CPU model and cores, CPU flags, BLAS kernels, library versions. The one definition that
    compare (two records: same bits expected?) and the work folder (this host: may a cell
    be reused?) share."""
    return {
        "CPU": [host.cpu_model, host.cores],
        "CPU flags": host.cpu_flags,
        "BLAS kernels": host.blas,
        "library versions": libraries,
    }


def host_fingerprint() -> dict[str, Any]:
    """This host's fingerprint, and the GPUs the driver lists. Two machines of one kind
    share it (a fresh lent machine reuses a work folder's cells); a machine that would
    compute other bits does not. Only NumPy's own BLAS counts: the other BLAS libraries
    loaded change during a process (SciPy's arrives with scikit-learn's moons data), and
    the frameworks' own are covered by their versions."""
    host = Host(
        hostname="",
        cpu_model=_cpu_model(),
        cpu_flags=_cpu_flags(),
        cores=os.cpu_count() or 0,
        os="",
        python="",
        blas=_blas(lambda path: "numpy" in Path(path).parent.name),
    )
    return {**fingerprint(host, library_versions()), "GPUs": _gpu_names()}


@functools.cache  # a subprocess, asked once: the GPUs do not change under a running process
def _gpu_names() -> list[str]:
    """The GPUs `nvidia-smi` lists (none where it is missing or fails); imports nothing."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        listed = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(line.strip() for line in listed.stdout.splitlines() if line.strip()) if listed.returncode == 0 else []


def _blas(loaded_from=lambda path: True) -> list[str]:
    """The BLAS libraries loaded in this process (those whose file `loaded_from` accepts),
    with the kernels each chose for this CPU."""
    from threadpoolctl import threadpool_info

    return [
        f"{lib['internal_api']} {lib.get('version') or '?'} {lib.get('architecture') or '?'}"
        for lib in threadpool_info()
        if lib["user_api"] == "blas" and loaded_from(lib.get("filepath") or "")
    ]


def library_versions() -> dict[str, str]:
    """Installed versions, read from package metadata: nothing is imported."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def git_info(root: Path = PROJECT_ROOT) -> Git:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return Git(commit=commit, dirty=None if status is None else bool(status))


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def new_id() -> str:
    return uuid.uuid4().hex[:12]


# --- writing -------------------------------------------------------------------------------


def _write_exclusive(path: Path, payload: bytes) -> None:
    """Write payload to a temporary file, then link it into place: a reader sees the whole
    file or none, and an existing file is never replaced."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        raise RecordError(f"{path}: already exists; records are never overwritten") from None
    except OSError as exc:
        raise RecordError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def ensure_writable(results_dir: Path) -> None:
    """Fail before any run when the results folder cannot be written, creating nothing: a
    run that then fails on its data leaves no empty folder behind (write_record makes it)."""
    existing = results_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "not a folder", str(existing))
        if existing == results_dir:
            probe = results_dir / f".write-test-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        elif not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied", str(existing))
    except OSError as exc:
        raise RecordError(f"{results_dir}: the results folder cannot be written: {exc.strerror or exc}") from None


def artifact_bytes(losses: np.ndarray, params, envelope: np.ndarray | None = None) -> bytes:
    """The .npz beside a record: the full loss curve, the final parameters and, for a float32
    run, the envelope that judged its curve (the relative tolerance per step)."""
    arrays = {"losses": np.asarray(losses)}
    if envelope is not None:
        arrays["envelope"] = np.asarray(envelope, dtype=np.float64)
    for i, (w, b) in enumerate(params or []):
        arrays[f"W{i}"], arrays[f"b{i}"] = w, b
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def record_path(results_dir: Path, record: Record) -> Path:
    stamp = record.created.replace(":", "").replace("-", "").replace("+0000", "Z")
    name = f"{stamp}_{record.framework}_{record.device.kind}_{record.spec.profile}_{record.record_id}"
    return results_dir / record.spec.name / f"{name}.json"


def write_record(results_dir: Path, record: Record, artifact: bytes | None = None) -> Path:
    """Validate and write a record (and its .npz artifact first, if any)."""
    path = record_path(results_dir, record)
    path.parent.mkdir(parents=True, exist_ok=True)
    if artifact is not None:
        npz = path.with_suffix(".npz")
        _write_exclusive(npz, artifact)
        record = record.model_copy(update={"artifacts": Artifact(file=npz.name, sha256=hashlib.sha256(artifact).hexdigest())})
    text = record.model_dump_json(indent=2) + "\n"
    try:
        Record.model_validate_json(text)
    except ValidationError as exc:
        raise RecordError(f"{path}: the record does not match the schema:\n{exc}") from None
    _write_exclusive(path, text.encode())
    return path


def read_record(path: Path) -> Record:
    try:
        return Record.model_validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise RecordError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise RecordError(f"{path}: not a harness record (schema {SCHEMA_VERSION}): {key}: {first['msg']}") from None
