"""The time of a `harness run` broken down per spec, per run and per role, from its log
(python3 tools/timings.py LOG [--wall SECONDS]): where a main job's minutes go.

Each run in the log is a line `SPEC LABEL (DTYPE, N steps, R repeat(s))` followed, when it
finishes, by `train T s, ...` (T the median training time of its R repeats). A run's time
is counted as R x T: data preparation, transfers and warm-up are not in the log (they are
in each record's `timings`), and are small beside training on the CPU.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

RUN = re.compile(
    r"^(?P<spec>\w+) (?P<label>\S+)(?: \((?P<role>[^)]*(?:\)[^(]*)?)\))? "
    r"\((?P<dtype>float\d+), (?P<steps>\d+) steps, (?P<repeats>\d+) repeat"
)
TRAIN = re.compile(r"^\s+train (?P<seconds>[\d.]+) s,")


def role(label: str, text: str | None) -> str:
    if "anchored" in label or (text and "re-anchored" in text):
        return "re-anchored runs"
    if text and "calibration" in text:
        return "calibration members"
    if text and "reference" in text:
        return "math parity's reference"
    if label.endswith("+float64"):
        return "float64 twins"
    if label.startswith("oracle@"):
        return "oracle"
    if "~" in label:
        return "calibration members"
    return "framework runs"


def main(argv: list[str]) -> int:
    lines = open(argv[0]).read().splitlines()
    wall = float(argv[argv.index("--wall") + 1]) if "--wall" in argv else None
    runs, current = [], None
    for line in lines:
        found = RUN.match(line)
        if found:
            current = found.groupdict()
            continue
        done = TRAIN.match(line)
        if done and current:
            seconds = float(done["seconds"]) * int(current["repeats"])
            kind = role(current["label"], current["role"])
            runs.append((current["spec"], current["label"], kind, int(current["steps"]), int(current["repeats"]), seconds))
            current = None
    by_spec, by_role = defaultdict(float), defaultdict(float)
    print("| spec | run | role | steps | repeats | training s |\n|---|---|---|---|---|---|")
    for spec, label, kind, steps, repeats, seconds in runs:
        by_spec[spec] += seconds
        by_role[(spec, kind)] += seconds
        print(f"| {spec} | {label} | {kind} | {steps:,} | {repeats} | {seconds:,.1f} |")
    total = sum(by_spec.values())
    print("\n| spec | role | training s | share of all training |\n|---|---|---|---|")
    for (spec, kind), seconds in sorted(by_role.items()):
        print(f"| {spec} | {kind} | {seconds:,.1f} | {seconds / total:.1%} |")
    whole = f"; the whole job's wall time: {wall:,.0f} s ({wall / 60:.1f} min)" if wall else ""
    print(f"\nTraining, all runs: {total:,.0f} s ({total / 60:.1f} min){whole}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
