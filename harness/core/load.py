"""How busy the host was with other work while a run was timed: the share of its CPU
capacity that went to anything but this process (other processes, and on a VM the time the
hypervisor gave to other guests, "steal"). A time per step measured on a loaded host says
more about the host than about the code; `harness compare` warns where load explains a
slowdown instead of failing it (harness/gate/compare.py).

Linux only (/proc/stat and this process's rusage); elsewhere the share is unknown (None).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

STAT = Path("/proc/stat")
# The columns of /proc/stat's `cpu` line: user nice system idle iowait irq softirq steal
# (guest time is counted in user already); idle and iowait are the capacity left unused.
BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
IDLE_COLUMNS = (3, 4)
# The least CPU capacity (seconds, all cores together) between two samples that gives a
# share: the kernel counts in ticks of 10 ms, so that 0.2 s is 20 ticks, a share to 5%.
MIN_SPAN_S = 0.2


@dataclass(frozen=True)
class Sample:
    busy_s: float  # the host's busy CPU seconds, all cores, since boot
    total_s: float  # its CPU seconds, busy or not
    own_s: float  # this process's CPU seconds (user and system, every thread)


def sample() -> Sample | None:
    """The host's and this process's CPU seconds now; None where /proc/stat is not there."""
    try:
        fields = STAT.read_text().split("\n", 1)[0].split()
        ticks = [int(v) for v in fields[1:9]]
        clock = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if fields[0] != "cpu" or len(ticks) < 8 or clock <= 0:
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    busy = sum(ticks[i] for i in BUSY_COLUMNS) / clock
    return Sample(busy_s=busy, total_s=busy + sum(ticks[i] for i in IDLE_COLUMNS) / clock, own_s=usage.ru_utime + usage.ru_stime)


def others_share(before: Sample | None, after: Sample | None) -> float | None:
    """The share (0 to 1) of the host's CPU capacity between two samples that went to
    anything but this process; None where either is unknown or too little time passed to
    tell (MIN_SPAN_S)."""
    if before is None or after is None:
        return None
    total = after.total_s - before.total_s
    if total < MIN_SPAN_S:
        return None
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return min(max(others / total, 0.0), 1.0)
