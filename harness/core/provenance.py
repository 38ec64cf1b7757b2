"""Where a run ran, measured once per run: the host (CPU, its flags, the BLAS kernels), the
installed library versions and the checkout's git commit; and the host's fingerprint, the
part of it that a run's bits and timings depend on."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.core import git
from harness.core.paths import PROJECT_ROOT

LIBRARIES = ("numpy", "pydantic", "pyyaml", "torch", "jax", "jaxlib", "optax", "cupy-cuda12x", "cupy-cuda13x")


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    @property
    def label(self) -> str:
        """The host as the report names and groups it: its hostname and cores. A hostname alone
        does not tell machines apart (the lent GPU machine and this project's VM are both `vm`)."""
        return f"{self.hostname} ({self.cores} cores)"


class Git(Frozen):
    commit: str | None
    dirty: bool | None


@dataclass(frozen=True)
class Provenance:
    """The facts every record of one run shares."""

    host: Host
    libraries: dict[str, str]
    git: Git


def _cpuinfo() -> tuple[str, str | None]:
    """The CPU's model name, and the sha256 (16 hex) of its sorted feature flags."""
    model, flags = None, None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if model is None and line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif flags is None and line.startswith(("flags", "Features")):
                flags = hashlib.sha256(" ".join(sorted(line.split(":", 1)[1].split())).encode()).hexdigest()[:16]
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def _blas(loaded_from=lambda path: True) -> list[str]:
    """The BLAS libraries loaded in this process (those whose file `loaded_from` accepts),
    with the kernels each chose for this CPU. NumPy's is always among them: it is loaded
    here if nothing loaded it yet."""
    import numpy  # noqa: F401
    from threadpoolctl import threadpool_info

    return [
        f"{lib['internal_api']} {lib.get('version') or '?'} {lib.get('architecture') or '?'}"
        for lib in threadpool_info()
        if lib["user_api"] == "blas" and loaded_from(lib.get("filepath") or "")
    ]


def host_info(numpy_blas_only: bool = False) -> Host:
    """This host. With `numpy_blas_only`, only NumPy's own BLAS is named: the other BLAS
    libraries loaded change during a process (SciPy's arrives with scikit-learn's moons
    data), and the frameworks' own are covered by their versions."""
    cpu_model, cpu_flags = _cpuinfo()
    loaded_from = (lambda path: "numpy" in Path(path).parent.name) if numpy_blas_only else (lambda path: True)
    return Host(
        hostname=platform.node(),
        cpu_model=cpu_model,
        cpu_flags=cpu_flags,
        cores=os.cpu_count() or 0,
        os=platform.platform(),
        python=platform.python_version(),
        blas=_blas(loaded_from),
    )


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
    commit, dirty = git.head(root)
    return Git(commit=commit, dirty=dirty)


def collect() -> Provenance:
    """This run's host, libraries and commit, asked once."""
    return Provenance(host_info(), library_versions(), git_info())


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
    """This host's fingerprint, with NumPy's BLAS only, and the GPUs the driver lists. Two
    machines of one kind share it (a fresh lent machine reuses a work folder's cells); a
    machine that would compute other bits does not."""
    return {**fingerprint(host_info(numpy_blas_only=True), library_versions()), "GPUs": _gpu_names()}


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
