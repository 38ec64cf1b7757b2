"""The time of a `harness run` broken down per spec, per run and per role, from its log
(python3 tools/timings.py LOG [--wall SECONDS]): where a main job's minutes go.

Each run in the log is a line `SPEC LABEL (DTYPE, N steps, R repeat(s))` followed, when it
finishes, by `train T s, ...` (T the median training time of its R repeats). A run's time
is counted as R x T: data preparation, transfers and warm-up are not in the log (they are
in each record's `timings`), and are small beside training on the CPU.

A log whose every line begins with the time it was written (`HH:MM:SS `, as
`... 2>&1 | while IFS= read -r l; do printf '%s %s\n' "$(date +%T)" "$l"; done > LOG`
writes it) gives each run's wall seconds too: from its first line to the next run's
(the last run's to the log's end), its process's start, imports, compiles, data,
evaluation and the checks after it included. A run's training is what the issue's ratio
counts; its wall span is what a user waits for.

The verdict's runs before any member (the oracle and its references, the float64 twins,
re-anchored or not: the re-anchored members are counted apart) are the part no calibration
policy can leave out: the line after the ratio says how long they trained beside the members.
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
STAMP = re.compile(r"^(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d) ")
FRAMEWORKS, VERDICT = "framework runs", "verdict"  # every role but the frameworks' runs is the verdict's


MEMBERS = ("calibration members", "re-anchored members")  # what a calibration policy decides to run


def role(label: str, text: str | None) -> str:
    if "anchored" in label or (text and "re-anchored" in text):
        # a member's variant is orderN, its library's as-X-orderN; a twin's or a reference's has none
        return "re-anchored members" if "order" in label.partition("~")[2] else "re-anchored runs"
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
    return FRAMEWORKS


def _side(kind: str) -> str:
    """Which side a run of this role is on: the frameworks' runs, or the verdict's."""
    return FRAMEWORKS if kind == FRAMEWORKS else VERDICT


def _ratio(verdict: float, frameworks: float) -> str:
    return f"{verdict / frameworks:.2f}x" if frameworks else "-"


def _stamps(lines: list[str]) -> tuple[list[str], list[int] | None]:
    """The lines without their stamps and each line's seconds since the first (a day's
    wrap counted), or the lines as they are and None where a line has no stamp."""
    found = [STAMP.match(line) for line in lines]
    if not lines or not all(found):
        return lines, None
    seconds, day, last = [], 0, None
    for f in found:
        t = int(f["h"]) * 3600 + int(f["m"]) * 60 + int(f["s"]) + day
        if last is not None and t < last:
            day, t = day + 86400, t + 86400
        seconds.append(t)
        last = t
    start = seconds[0]
    return [line[len(f[0]) :] for line, f in zip(lines, found)], [t - start for t in seconds]


def main(argv: list[str]) -> int:
    lines, stamps = _stamps([line for line in open(argv[0]).read().splitlines() if line.strip()])
    wall = float(argv[argv.index("--wall") + 1]) if "--wall" in argv else None
    runs, current, starts = [], None, []
    for i, line in enumerate(lines):
        found = RUN.match(line)
        if found:
            current = found.groupdict()
            starts.append(i)
            continue
        done = TRAIN.match(line)
        if done and current:
            seconds = float(done["seconds"]) * int(current["repeats"])
            kind = role(current["label"], current["role"])
            runs.append((current["spec"], current["label"], kind, int(current["steps"]), int(current["repeats"]), seconds, starts[-1]))
            current = None
    by_spec, by_role = defaultdict(float), defaultdict(float)
    print("| spec | run | role | steps | repeats | training s |\n|---|---|---|---|---|---|")
    for spec, label, kind, steps, repeats, seconds, _ in runs:
        by_spec[spec] += seconds
        by_role[(spec, kind)] += seconds
        print(f"| {spec} | {label} | {kind} | {steps:,} | {repeats} | {seconds:,.1f} |")
    total = sum(by_spec.values())
    print("\n| spec | role | training s | share of all training |\n|---|---|---|---|")
    for (spec, kind), seconds in sorted(by_role.items()):
        print(f"| {spec} | {kind} | {seconds:,.1f} | {seconds / total:.1%} |")
    whole = f"; the whole job's wall time: {wall:,.0f} s ({wall / 60:.1f} min)" if wall else ""
    print(f"\nTraining, all runs: {total:,.0f} s ({total / 60:.1f} min){whole}")
    trained = {FRAMEWORKS: 0.0, VERDICT: 0.0}
    for _, _, kind, _, _, seconds, _ in runs:
        trained[_side(kind)] += seconds
    ratio = _ratio(trained[VERDICT], trained[FRAMEWORKS])
    print(f"The verdict's runs trained {trained[VERDICT]:,.1f} s, the frameworks' runs {trained[FRAMEWORKS]:,.1f} s: {ratio}")
    members = sum(seconds for _, _, kind, _, _, seconds, _ in runs if kind in MEMBERS)
    before = trained[VERDICT] - members
    print(
        f"Before any member (the verdict's runs but its calibration and re-anchored members): {before:,.1f} s, "
        f"{_ratio(before, trained[FRAMEWORKS])} of the frameworks' runs; the members {members:,.1f} s"
    )
    if stamps is not None:
        print(_walls(runs, starts, stamps))
    return 0


def _walls(runs: list[tuple], starts: list[int], stamps: list[int]) -> str:
    """Each side's wall seconds: a finished run's from its first line to the next run's
    first line (the log's end after the last). A run that never finished is left out, and
    said."""
    ends = dict(zip(starts, [*starts[1:], len(stamps) - 1]))
    walls = {FRAMEWORKS: 0, VERDICT: 0}
    for _, _, kind, _, _, _, start in runs:
        walls[_side(kind)] += stamps[ends[start]] - stamps[start]
    unfinished = len(starts) - len(runs)
    left = f" ({unfinished} run(s) that did not finish left out)" if unfinished else ""
    return (
        f"Wall (each run from its first line to the next run's): the verdict's runs {walls[VERDICT]:,} s, "
        f"the frameworks' runs {walls[FRAMEWORKS]:,} s: {_ratio(walls[VERDICT], walls[FRAMEWORKS])}{left}; the log spans {stamps[-1]:,} s"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
