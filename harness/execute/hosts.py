"""The same job on several hosts or GPU models (`--places`, `--gpu-types`, on Ray): each
framework job runs once per place; the first place's runs are the matrix's, the others are
judged against them (harness/verdict/cross_host.py)."""

from __future__ import annotations

from dataclasses import replace

from harness.execute.capacity import GPU_TYPE
from harness.execute.jobs import FRAMEWORK, Job


def is_copy(job: Job) -> bool:
    """Whether a job is a framework job's run at a place after the first."""
    return job.place is not None and job.name.endswith(f" at {job.place}")


def spread(jobs: list[Job], places: list[str]) -> list[Job]:
    """Each framework job once per place it can run at (a GPU model only for GPU jobs);
    the first copy keeps the job's name."""
    if not places:
        return jobs
    found = []
    for job in jobs:
        where = [p for p in places if job.role == FRAMEWORK and (job.gpu or not p.startswith(GPU_TYPE))]
        if not where:
            found.append(job)
            continue
        found += [replace(job, place=p, name=job.name if i == 0 else f"{job.name} at {p}") for i, p in enumerate(where)]
    return found
