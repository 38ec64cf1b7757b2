"""The command line's arguments: every subcommand's options, each checked as it is parsed
(a bad value is one line and exit code 2, before any work)."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from harness.core.paths import REFERENCE_DIR, RUNS_DIR, SPECS_DIR
from harness.core.registry import ADAPTERS, DEVICES, EAGER, FAST, LEAST_SEEDS, MODES, PRECISION_CHOICES, REFERENCE_DEVICES
from harness.execute.capacity import LOCAL, RAY
from harness.inputs import resources
from harness.options import MAX_SEEDS
from harness.spec import model as spec_mod
from harness.spec.fields import MAX_REPEATS, MAX_SWEEP_POINTS

# The most of each count an option gives, far above any use and far below what would stall
# a run: jobs and threads of a Ray cluster (a local run is bounded by its cores as well:
# harness/execute/executors.py), a smoke's steps (a few: a training is `run`), the names
# of --gpu-types and --places.
MAX_JOBS = 1024
MAX_THREADS = 1024
MAX_SMOKE_STEPS = 1000
MAX_PLACES = 64
PLACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
# A Ray address: host:port or ray://host:port (a name, an IPv4 address or an [IPv6] one),
# or Ray's own `auto` and `local`.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
RAY_ADDRESS = re.compile(rf"auto|local|(?:ray://)?(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{{1,5}})")


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose error is one line (not the usage, then the error): the
    option and what is wrong with it, and where the options are listed."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (`{self.prog} --help` lists the options)\n")


def _csv(allowed: tuple[str, ...], what: str):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        unknown = [t for t in items if t not in allowed]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown) or '(none)'}; choose from {', '.join(allowed)}")
        return list(dict.fromkeys(items))  # each once: jax,jax is jax

    return parse


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"values must be positive: {text!r}")
    return values


def _sweep_values(text: str) -> list[int]:
    values = _positive_ints(text)
    if len(values) > MAX_SWEEP_POINTS:
        raise argparse.ArgumentTypeError(f"at most {MAX_SWEEP_POINTS} values (each is a set of runs): {len(values)} given")
    return values


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole number' if kind is int else 'number'}: {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive and finite: {text!r}")
        return value

    return parse


def _count(most: int, why: str):
    """A whole number from 1 to `most`; `why` says what a larger one would do."""
    positive = _positive(int)

    def parse(text: str) -> int:
        value = positive(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"at most {most:,} ({why}): {text!r}")
        return value

    return parse


def _executor(text: str) -> str:
    """local, ray, or ray:ADDRESS with an address Ray could reach (RAY_ADDRESS)."""
    if text in (LOCAL, RAY):
        return text
    kind, colon, address = text.partition(":")
    if kind != RAY or not colon:
        raise argparse.ArgumentTypeError(f"{text!r}: choose local, ray or ray:ADDRESS")
    found = RAY_ADDRESS.fullmatch(address)
    if found is None or (found["port"] is not None and not 0 < int(found["port"]) < 65536):
        raise argparse.ArgumentTypeError(
            f"{text!r}: ADDRESS is host:port (a port from 1 to 65535), ray://host:port, auto or local, e.g. ray:10.0.0.5:6379"
        )
    return text


def _places(text: str) -> list[str]:
    """Comma-separated names of GPU models or Ray resources: letters, digits, _ . : -"""
    names = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if not PLACE.fullmatch(n)]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"not a list of names (letters, digits, _ . : -, at most 64 each): {text!r}")
    if len(names) > MAX_PLACES:
        raise argparse.ArgumentTypeError(f"at most {MAX_PLACES} names (each runs every job once more): {len(names)} given")
    return names


def limit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-memory-gb",
        type=_positive(float),
        default=resources.DEFAULT_MAX_MEMORY_GB,
        help=f"refuse a spec estimated to need more memory (default: {resources.DEFAULT_MAX_MEMORY_GB:g} GiB)",
    )
    p.add_argument(
        "--max-steps",
        type=_positive(int),
        default=resources.DEFAULT_MAX_STEPS,
        help=f"refuse a spec of more training steps (default: {resources.DEFAULT_MAX_STEPS:,})",
    )


def limits(args: argparse.Namespace) -> resources.Limits:
    return resources.Limits(args.max_memory_gb, args.max_steps)


def gpu_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tf32", action="store_true", help="also run each framework on the GPU with TF32 allowed (measured, not gated)")
    p.add_argument(
        "--precisions",
        type=_csv(PRECISION_CHOICES, "precision"),
        help="float32 (the strict runs, always run) and bf16: torch's autocast and flax's modules in bfloat16, a cell each (measured, not gated)",
    )
    p.add_argument(
        "--references",
        choices=REFERENCE_DEVICES,
        default="cpu",
        help="where the float64 oracle, its calibration run and members run: cpu (NumPy, the default) or gpu (the same code on CuPy, "
        "where the CPU's would take longer than the GPU runs they judge); each record says where",
    )
    p.add_argument("--require-gpu", action="store_true", help="stop with one line, before any run, if no framework finds a GPU")
    p.add_argument(
        "--work-dir",
        type=Path,
        help="keep each finished run here; a later call with the same inputs reuses it (split a long matrix, resume a crash)",
    )


def speed_options(p: argparse.ArgumentParser, modes: list[str]) -> None:
    p.add_argument(
        "--modes",
        type=_csv(MODES, "mode"),
        default=modes,
        help=f"eager (the article-style code), fast (each framework's compiled mode), or both (default: {','.join(modes)})",
    )
    p.add_argument("--no-floor", action="store_true", help="skip measuring the devices' rates: the records carry no floor")


def parser(description: str) -> argparse.ArgumentParser:
    parser = Parser(prog="harness", description=description)
    sub = parser.add_subparsers(dest="command", required=True)

    def data_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--profile", default=spec_mod.FULL_PROFILE, help="a profile defined in the spec (default: full)")
        p.add_argument("--data-dir", type=Path, help="folder with data files (default: $HARNESS_DATA_DIR, else a cache folder)")
        p.add_argument("--data-source", help="a named data source of the spec, e.g. test-set for MNIST offline")
        p.add_argument("--download", action="store_true", help="download missing data files from the fixed mirrors")
        p.add_argument("--specs-dir", type=Path, default=SPECS_DIR, help=argparse.SUPPRESS)

    def matrix_options(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--frameworks",
            type=_csv(tuple(ADAPTERS), "framework"),
            default=None,
            metavar="LIST",
            help=f"comma-separated, of {', '.join(ADAPTERS)} (default: all; numpy runs on the CPU only, cupy on "
            "the GPU only: the same array-module code). The float64 oracle, its "
            "reordered calibration members and the float64 twins of the frameworks chosen always run "
            "too: every verdict is judged against them",
        )
        p.add_argument(
            "--devices",
            type=_csv(DEVICES, "device"),
            default=["cpu"],
            metavar="LIST",
            help=f"comma-separated, of {', '.join(DEVICES)} (default: cpu)",
        )
        p.add_argument(
            "--executor",
            type=_executor,
            default="local",
            help="where the jobs run: local (fresh processes of this machine), ray (a local Ray, or $RAY_ADDRESS), "
            "ray:ADDRESS (a Ray cluster; pip install '.[ray]') (default: local)",
        )
        p.add_argument(
            "--jobs",
            type=_count(MAX_JOBS, "a local run: this host's cores"),
            help="jobs at once (default: local, 1 with the frameworks' own threads; ray, as the cluster has room). "
            "With more than 1, each job's threads are capped at cores // jobs: bits may differ from uncapped runs",
        )
        p.add_argument(
            "--threads",
            type=_count(MAX_THREADS, "a local run: this host's cores"),
            help="each job's torch, BLAS and XLA threads (default: the frameworks' own)",
        )
        p.add_argument(
            "--gpu-types",
            type=_places,
            help="with --executor ray: run every GPU job once on each of these GPU models (Ray accelerator types, e.g. H100,H200)",
        )
        p.add_argument(
            "--places",
            type=_places,
            help="with --executor ray: run every framework job once on a node with each of these custom Ray resources (hosts)",
        )
        p.add_argument(
            "--results",
            type=Path,
            default=RUNS_DIR,
            help=f"records folder (default: {RUNS_DIR}/, git-ignored; the committed reference records are in {REFERENCE_DIR}/)",
        )

    run = sub.add_parser("run", help="run specs through adapters and devices, check, write records")
    run.add_argument("specs", nargs="*", help="spec names or paths (default: every spec in specs/)")
    matrix_options(run)
    run.add_argument("--no-records", action="store_true", help="print the verdicts, write nothing")
    run.add_argument("--members", action="store_true", help="a row per calibration member in the table (folded into one by default)")
    run.add_argument("--repeats", type=_count(MAX_REPEATS, "each repeat is a whole timed training run"), help="timing repeats (default: the spec's)")
    run.add_argument("--in-process", action="store_true", help="run every job in this process (debugging; timings suffer)")
    run.add_argument(
        "--train-anyway",
        action="store_true",
        help="a port whose initial forward pass differs from torch's (math_initial_forward FAIL) trains all the same (by default nothing trains)",
    )
    run.add_argument(
        "--seeds",
        type=_count(MAX_SEEDS, "each seed runs every cell again"),
        help=f"also run each framework's cells at N-1 more seeds (at least {LEAST_SEEDS}) and judge their final metrics' "
        "distributions, seed by seed paired (the verdict over seeds, docs/verdict.md)",
    )
    speed_options(run, [EAGER])
    gpu_options(run)
    limit_options(run)
    data_options(run)

    bench = sub.add_parser("bench", help="eager and fast modes side by side: time per step, fast/eager and measured/floor; records as usual")
    bench.add_argument("specs", nargs="*", help="spec names or paths (default: every spec in specs/)")
    matrix_options(bench)
    bench.add_argument("--no-records", action="store_true", help="print the tables, write nothing")
    bench.add_argument(
        "--repeats", type=_count(MAX_REPEATS, "each repeat is a whole timed training run"), default=5, help="timing repeats of each run (default: 5)"
    )
    speed_options(bench, [EAGER, FAST])
    gpu_options(bench)
    limit_options(bench)
    data_options(bench)
    bench.set_defaults(profile=spec_mod.BENCH_PROFILE)

    sweep = sub.add_parser("sweep", help="run a spec's crossover sweep (e.g. peaks over 100..160,000 points); records as usual")
    sweep.add_argument("specs", nargs="*", help="spec names or paths (default: every spec that declares a sweep)")
    matrix_options(sweep)
    sweep.add_argument(
        "--repeats", type=_count(MAX_REPEATS, "each repeat is a whole timed training run"), help="timing repeats (default: the spec's)"
    )
    sweep.add_argument("--values", type=_sweep_values, help="the sweep's values to run (default: the spec's)")
    speed_options(sweep, [EAGER])
    gpu_options(sweep)
    limit_options(sweep)
    sweep.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    sweep.add_argument("--specs-dir", type=Path, default=SPECS_DIR, help=argparse.SUPPRESS)

    validate = sub.add_parser("validate", help="validate specs and every profile in them")
    validate.add_argument("specs", nargs="*")
    limit_options(validate)
    validate.add_argument(
        "--data-dir",
        type=Path,
        help="check each image file found here against the model's input (default: $HARNESS_DATA_DIR, else a cache folder)",
    )
    validate.add_argument("--specs-dir", type=Path, default=SPECS_DIR, help=argparse.SUPPRESS)

    export = sub.add_parser(
        "export",
        help="write a spec's inputs and the oracle's loss curve to an .npz "
        "(it trains the float64 oracle over every step of the profile: minutes for a full one)",
    )
    export.add_argument("spec")
    export.add_argument("--out", type=Path, help="output file (default: exports/SPEC-PROFILE.npz)")
    limit_options(export)
    data_options(export)

    comp = sub.add_parser("compare", help="compare new records with a baseline; exit 1 on a regression")
    comp.add_argument("new", type=Path, nargs="?", default=RUNS_DIR, help=f"folder of new records (default: {RUNS_DIR})")
    comp.add_argument("--all", action="store_true", help="print every finding as a table, not the summary")
    comp.add_argument("--baseline", required=True, help=f"folder of baseline records, or git:REV for {REFERENCE_DIR}/ at REV (a sha or a ref)")

    rep = sub.add_parser("report", help="write results/REPORT.md and its figures from the records (no training)")
    rep.add_argument(
        "--results",
        type=Path,
        default=REFERENCE_DIR,
        help=f"records folder (default: {REFERENCE_DIR}, the committed reference records; {RUNS_DIR} for your own)",
    )
    rep.add_argument("--out", type=Path, help="a folder for REPORT.md and figures/, or a .md file (figures/ beside it); default: RESULTS/REPORT.md")
    rep.add_argument("--profile", help="profile of the main tables (default: full, or the one profile the records hold)")

    schema = sub.add_parser("schema", help="write specs/schema.json, results/schema.json and docs/spec-reference.md (every spec key, generated)")
    schema.add_argument("--check", action="store_true", help="fail if the committed schema files or the spec reference are out of date")

    smoke = sub.add_parser(
        "smoke",
        help="a machine's first call: every adapter trains every spec's network for a few steps on synthetic inputs, "
        "in every precision and mode, and reads its math-mode flags back (no data files, no records)",
    )
    smoke.add_argument("specs", nargs="*", help="spec names or paths (default: every spec in specs/)")
    smoke.add_argument(
        "--frameworks",
        type=_csv(tuple(ADAPTERS), "framework"),
        default=None,
        metavar="LIST",
        help=f"comma-separated, of {', '.join(ADAPTERS)} (default: all, each where it runs)",
    )
    smoke.add_argument(
        "--devices",
        type=_csv(DEVICES, "device"),
        default=None,
        metavar="LIST",
        help=f"comma-separated, of {', '.join(DEVICES)} (default: the CPU, and the GPU where a framework finds one)",
    )
    smoke.add_argument(
        "--steps", type=_count(MAX_SMOKE_STEPS, "a smoke is a few steps; a training is `run`"), default=3, help="steps of each run (default: 3)"
    )
    smoke.add_argument("--out", type=Path, help="write the rows, the versions and what the specs cover to this JSON file")
    smoke.add_argument("--specs-dir", type=Path, default=SPECS_DIR, help=argparse.SUPPRESS)

    sub.add_parser("list", help="list specs, adapters and devices")
    return parser
