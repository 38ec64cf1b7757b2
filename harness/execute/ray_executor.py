"""`--executor ray`: each job a Ray task (an optional extra: pip install '.[ray]').

A job asks for `num_cpus` (its thread cap: 1 unless --threads), `num_gpus=1` if it runs on
the GPU, and where the matrix asks for it on each of several places, `accelerator_type`
(--gpu-types H100,H200) or a custom resource the user gave the nodes (--places). Each task
runs in a fresh worker process (`max_calls=1`: frameworks' thread pools and GPU memory never
meet, as with the local executor); a worker killed mid-job is retried `RAY_RETRIES` times
and then reported as a failed run with Ray's reason. Ray connects to ADDRESS
(`ray:ADDRESS`), else to $RAY_ADDRESS, else starts a local Ray on this machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from harness.core.errors import HarnessError
from harness.core.paths import PROJECT_ROOT
from harness.execute.capacity import GPU_TYPE, RAY, RAY_RETRIES, Slots, cap_threads, prepare_worker_environment


def _task(threads: int, call: Callable[..., Any], *args: Any) -> Any:
    """A job in its Ray worker: the node named (the record says where it ran), the
    threads capped before any framework starts."""
    import ray

    os.environ["HARNESS_NODE"] = ray.get_runtime_context().get_node_id()[:12]
    cap_threads(threads)
    return call(*args)


class RayExecutor:
    def __init__(self, address: str | None, jobs: int | None, threads: int | None, gpu_types: list[str], places: list[str]):
        try:
            import ray
        except ImportError:
            raise HarnessError("--executor ray: Ray is not installed here (pip install '.[ray]')") from None
        self.ray = ray
        address = address or os.environ.get("RAY_ADDRESS") or None
        if not ray.is_initialized():
            # the workers import the project from its checkout: on a cluster, every node has
            # one at the same path (or give Ray a runtime_env working_dir)
            path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
            env = {"env_vars": {"PYTHONPATH": path, **prepare_worker_environment()}}
            try:
                ray.init(address=address, include_dashboard=False, logging_level="WARNING", runtime_env=env)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise HarnessError(f"--executor ray: cannot connect to Ray at {address or 'a new local instance'}: {exc}") from None
        threads = threads or 1
        self.slots = Slots(RAY, jobs or max(1, int(ray.cluster_resources().get("CPU", 1)) // threads), threads)
        self.places = [GPU_TYPE + t for t in gpu_types] + list(places)
        self.remote = ray.remote(max_calls=1)(_task)

    def submit(self, job, call: Callable[..., Any], *args: Any) -> Future:
        """call(*args) as a task; `job` (harness/execute/jobs.py, or None) says what it needs."""
        options: dict[str, Any] = {"num_cpus": self.slots.threads, "max_retries": RAY_RETRIES}
        if job is not None and job.gpu:
            options["num_gpus"] = 1
        place = None if job is None else job.place
        if place and place.startswith(GPU_TYPE):
            options["accelerator_type"] = place.removeprefix(GPU_TYPE)
        elif place:
            options["resources"] = {place: 0.001}
        return self.remote.options(**options).remote(self.slots.threads, call, *args).future()

    def shutdown(self) -> None:
        pass  # a local Ray started here ends with this process; a cluster stays up
