"""The command line: exit codes 0 / 1 / 2, records written or not, export."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness import arguments, cli, session
from harness.core import paths
from harness.core.paths import SPECS_DIR
from tests.conftest import ROOT
from tests.helpers import tiny_moons


def harness(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def test_run_writes_records_and_exits_zero(tmp_path):
    spec = tiny_moons(tmp_path)  # the moons spec at 64 points and 3 steps: every part of a run, in seconds
    done = harness("run", str(spec), "--frameworks", "numpy", "--results", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Verdicts" in done.stdout and "3 records written" in done.stdout
    said = " ".join(done.stdout.split())  # what runs besides the frameworks asked for, said first
    assert "besides numpy, this runs oracle@cpu (the float64 reference, recorded)" in said
    # every check passes on the zeroth look (harness/calibrate/roles.py ZEROTH): no member runs
    table = said.split("Verdicts")[1]
    assert "zeroth look" not in said and "members member" not in table and "~order" not in table
    assert len(list((tmp_path / "moons_net").glob("*.json"))) == 3  # numpy, the oracle, numpy's float64 twin
    from harness.records.store import read_record

    written = list(map(read_record, (tmp_path / "moons_net").glob("*.json")))
    assert [r.floor for r in written if r.precision_mode == "float64"] == [None]  # the floor is float32's
    floors = {r.framework: r.floor for r in written if r.precision_mode != "float64"}
    assert floors["oracle"] is None and floors["numpy"].measured_over_floor > 0  # `run` measures the floor too
    if Path("/proc/stat").exists():  # how loaded the host was while each run was timed (compare reads it)
        # None: too short a run to tell (numpy's float64 twin, read from the oracle's run, is not timed)
        shares = [r.timings.others_cpu_share for r in written if r.read_from is None]
        assert len(shares) == 2
        assert all(share is None or 0 <= share <= 1 for share in shares)


def test_a_failing_check_exits_one(tmp_path):
    spec = tiny_moons(tmp_path, checks__initial_loss={"rtol": 0.0, "atol": 0.0})  # float32 cannot equal float64 exactly
    done = harness("run", str(spec), "--frameworks", "numpy", "--no-records", "--no-floor")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL moons_net numpy@cpu vs oracle@cpu: initial_loss" in done.stdout
    assert "diagnosis: rounding: float32 only, the spec's tolerance is zero;" in " ".join(done.stdout.split())


def test_a_data_source_no_spec_names_is_a_note_and_the_run_goes_on(tmp_path):
    """Issue 55: `--data-source test-set` on a spec without that source said nothing. It is
    one note naming the specs (not a refusal: the GPU contact passes it to every phase)."""
    spec = tiny_moons(tmp_path)
    done = harness("run", str(spec), "--frameworks", "numpy", "--no-records", "--no-floor", "--data-source", "test-set")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--data-source test-set: moons_net name no such source and run on their own data" in " ".join(done.stdout.split())


def test_bad_input_exits_two_and_writes_nothing(tmp_path):
    results = tmp_path / "results"
    for args, message in [
        (["run", "nope", "--results", str(results)], "unknown spec 'nope'"),
        (["run", "--frameworks", "tensorflow", "--results", str(results)], "unknown framework tensorflow"),
        (["run", "--devices", "tpu", "--results", str(results)], "unknown device tpu"),
        (["run", "peaks_mlp", "--profile", "huge", "--results", str(results)], "profile 'huge' is not defined"),
        (["run", str(tmp_path / "missing.yaml"), "--results", str(results)], "no such spec file"),
    ]:
        done = harness(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr
    assert not results.exists()


def test_a_framework_on_no_device_it_runs_on_is_bad_input(tmp_path):
    """cupy is the array-module code on the GPU: asked for on the CPU alone, one line says
    where it runs and what the CPU's name for that code is; nothing runs."""
    done = harness("run", "peaks_mlp", "--frameworks", "cupy", "--devices", "cpu", "--results", str(tmp_path / "r"))
    assert done.returncode == 2 and not (tmp_path / "r").exists()
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "error: --frameworks cupy: cupy runs on the gpu only (numpy and cupy are the same array-module code on the "
        "CPU and the GPU); add gpu to --devices"
    ]


def test_missing_mnist_files_exit_two(tmp_path):
    done = harness(
        "run", "mnist_mlp", "--profile", "quick", "--data-dir", str(tmp_path), "--data-source", "train-set", "--results", str(tmp_path / "r")
    )
    assert done.returncode == 2 and "train-images-idx3-ubyte.gz: missing" in done.stderr
    assert "--data-source test-set" in done.stderr  # the offline way out is named
    assert not (tmp_path / "r").exists()  # not even an empty results folder


def test_runs_go_to_a_git_ignored_folder_and_the_report_reads_the_reference_records():
    """A user's runs never touch the committed records: run, bench and sweep write to runs/
    (git-ignored) unless told otherwise; the report and `compare --baseline git:REV` read
    the reference records in results/."""

    parser = arguments.parser(cli.__doc__.splitlines()[0])
    for command in ("run", "bench", "sweep"):
        assert parser.parse_args([command]).results == paths.RUNS_DIR
    assert parser.parse_args(["compare", "--baseline", "b"]).new == paths.RUNS_DIR
    assert parser.parse_args(["report"]).results == paths.REFERENCE_DIR
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: git-ignore rules cannot be asked")

    def ignored(path: str) -> bool:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0

    assert ignored(f"{paths.RUNS_DIR}/peaks_mlp/20260101T000000Z_torch_cpu_full_0.json")
    assert not ignored(f"{paths.REFERENCE_DIR}/peaks_mlp/20260101T000000Z_torch_cpu_full_0.json")


@pytest.mark.parametrize("command", ["run", "bench", "sweep"])
def test_help_names_every_framework_and_device_and_what_else_runs(command):
    from harness.core.registry import ADAPTERS, DEVICES

    done = subprocess.run(
        [sys.executable, "-m", "harness", command, "--help"], capture_output=True, text=True, cwd=ROOT, env={"COLUMNS": "100", "PATH": ""}
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for name in (*ADAPTERS, *DEVICES):
        assert name in text
    assert "oracle" in text and "twins" in text and "git-ignored" in text


def test_validate_and_schema_check():
    done = harness("validate")
    assert done.returncode == 0 and done.stdout.count(": ok") == 7
    assert harness("schema", "--check").returncode == 0


def test_export_writes_inputs_and_oracle_curve(tmp_path):
    out = tmp_path / "peaks.npz"
    done = harness("export", "peaks_mlp", "--profile", "quick", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "peaks_mlp oracle@cpu step 100/100" in done.stdout  # the oracle's training shows progress
    assert "training the float64 oracle over all 100 steps of the quick profile" in " ".join(done.stdout.split())
    with np.load(out) as arrays:
        assert arrays["x_train"].shape == (2500, 2) and arrays["dense1.weight"].shape == (2, 20)
        assert arrays["oracle_losses"].shape == (100,) and str(arrays["profile"]) == "quick"


BAD_SPECS = {
    "yaml_does_not_parse": ("a: [1, 2", "not valid YAML: line 1, column 9: expected ',' or ']'"),
    "unknown_layer_kind": (lambda d: d["model"]["layers"][0].update(kind="dens"), "model.layers.0.kind: 'dens' is none of dense, conv2d"),
    "unknown_optimizer_kind": (lambda d: d["optimizer"].update(kind="adamm"), "optimizer.kind: 'adamm' is none of adam, adamw, sgd, rmsprop"),
    "unknown_key": (lambda d: d.update(colour="blue"), "colour: unknown key"),
    "missing_key": (lambda d: d.pop("optimizer"), "optimizer: missing key"),
    "wrong_type": (lambda d: d["training"].update(epochs="many"), "training.epochs: Input should be a valid integer"),
    "lr_zero": (lambda d: d["optimizer"].update(lr=0), "optimizer.lr: Input should be greater than 0"),
    "width_zero": (lambda d: d["model"]["layers"][0].update(width=0), "model.layers.0.width: Input should be greater than 0"),
    "negative_epochs": (lambda d: d["training"].update(epochs=-5), "training.epochs: Input should be greater than 0"),
    "batch_larger_than_data": (
        lambda d: d["training"].update(batch_size=6000, last_batch="drop"),
        "training.batch_size: 6000 is larger than the 5000 training examples",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_through_the_cli_exits_two_and_writes_nothing(tmp_path, case):
    change, message = BAD_SPECS[case]
    spec = tmp_path / f"{case}.yaml"
    if isinstance(change, str):
        spec.write_text(change)
    else:
        doc = yaml.safe_load((SPECS_DIR / "moons_net.yaml").read_text())
        change(doc)
        spec.write_text(yaml.safe_dump(doc))
    done = harness("run", str(spec), "--results", str(tmp_path / "results"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert str(spec) in done.stderr and message in done.stderr and "Traceback" not in done.stderr
    assert "<unicode string>" not in done.stderr and "_kind()" not in done.stderr
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("*.json"))


@pytest.mark.parametrize("damage", ["truncated", "wrong_magic"])
def test_damaged_data_file_exits_two(tmp_path, mnist_dir, damage):
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(mnist_dir / name, tmp_path / name)
    target = tmp_path / "t10k-labels-idx1-ubyte.gz"
    raw = target.read_bytes()
    target.write_bytes(raw[:-100] if damage == "truncated" else b"\x00\x00\x07\x01" + raw[4:])
    done = harness(
        "run", "mnist_mlp", "--profile", "quick", "--data-dir", str(tmp_path), "--data-source", "test-set", "--results", str(tmp_path / "results")
    )
    assert done.returncode == 2 and f"{target}: checksum mismatch" in done.stderr
    assert not list((tmp_path / "results").rglob("*.json"))


def test_bench_writes_both_modes_with_their_floor_and_the_report_shows_them(tmp_path):
    """`harness bench`: eager and fast side by side, each record with its mode and the
    floor measured on this host; the report's floor section is built from them."""
    pytest.importorskip("matplotlib")
    from harness.records.store import read_record

    results = tmp_path / "records"
    done = harness("bench", "peaks_mlp", "--profile", "quick", "--frameworks", "numpy", "--repeats", "2", "--results", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "floor: cpu rates" in done.stdout and "fast/eager" in done.stdout
    written = [r for r in map(read_record, (results / "peaks_mlp").glob("*.json")) if r.precision_mode != "float64"]
    by_mode = {(r.framework, r.mode): r for r in written}
    assert set(by_mode) == {("numpy", "eager"), ("numpy", "fast"), ("oracle", "eager")}
    fast, eager, oracle = by_mode["numpy", "fast"], by_mode["numpy", "eager"], by_mode["oracle", "eager"]
    assert oracle.floor is None  # float64: the floor counts float32 bytes and rates
    for record in (eager, fast):
        assert record.floor.bound in ("arithmetic", "bandwidth") and record.floor.launch_s == 0
        assert record.floor.measured_over_floor == pytest.approx(record.timings.per_step_s / record.floor.floor_s)
        assert record.timings.repeats == 2 and len(record.timings.warmup_s_each) == 2
    assert "fast mode" in fast.implementation and "fast mode" not in eager.implementation
    assert not [c for c in fast.checks if c.verdict == "fail"]

    out = tmp_path / "report" / "REPORT.md"
    done = harness("report", "--results", str(results), "--out", str(out), "--profile", "quick")
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    section = text[text.index("## Fast modes and the hardware floor") :]
    row = next(line for line in section.splitlines() if line.startswith("| peaks_mlp | quick | 2,500 | numpy |"))
    ratio = eager.timings.per_step_s / fast.timings.per_step_s
    assert f"{ratio:.3g}x" in row and f"{fast.floor.measured_over_floor:.3g}" in row
    assert (out.parent / "figures" / "measured_over_floor.png").stat().st_size > 1000


def test_bench_refuses_an_unknown_mode(tmp_path):
    done = harness("bench", "moons_net", "--modes", "eager,turbo", "--results", str(tmp_path))
    assert done.returncode == 2 and "unknown mode turbo" in done.stderr
    assert not any(tmp_path.iterdir())


def test_the_verdict_table_folds_the_members_into_one_row(members_from_the_start):
    """The calibration members of a spec, one row by default (--members: a row each)."""
    import io

    from rich.console import Console

    from harness import matrix
    from harness.execute import plan
    from harness.inputs.problem import build_problem
    from harness.report.table import verdict_table
    from harness.spec.load import load_spec

    one_each = {"checks": {"long_run": {"members": 1}, "math_parity": {"members": 1}}}
    loaded = load_spec(SPECS_DIR / "peaks_mlp.yaml", "quick", one_each)
    result = matrix.run_cells(loaded, build_problem(loaded), plan.matrix_keys(["numpy"], ["cpu"]), None, Console(file=io.StringIO()), repeats=1)
    assert sorted(r.variant for r in result.member_records) == ["order1", "order1"]  # the first look's float32 and float64 members

    def shown(members: bool) -> str:
        out = io.StringIO()
        Console(file=out, width=200).print(verdict_table([result], members=members))
        return out.getvalue()

    folded, each = shown(False), shown(True)
    assert "2 members" in folded and "~order1" not in folded
    assert " numpy@cpu~order1 " in each and " oracle@cpu~order1 " in each and "2 members" not in each


def test_the_verdict_table_fits_100_columns_with_every_run_label_whole():
    """The verdict table's natural width fits a 100-column terminal, no cell wrapped, also
    with a row per calibration member (--members; folded into one row by default)."""
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", "peaks_mlp", "--profile", "quick", "--frameworks", "numpy,jax", "--no-records", "--no-floor"]
        + ["--members"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    # A log is printed 160 wide, and a rich table is no wider than its cells: its lines
    # measure the table's own width, which must fit a 100-column terminal unwrapped.
    lines = done.stdout[done.stdout.index("Verdicts") :].splitlines()
    table = lines[: next(i for i, line in enumerate(lines) if i > 2 and not line.strip())]
    assert max(len(line.rstrip()) for line in table) <= 100, "\n".join(table)
    assert not any(line.startswith(" " * 20) for line in table[3:]), "a cell wrapped:\n" + "\n".join(table)
    # a member's row (JAX's checks known on the first look, no more members run; the later
    # ones' labels are as wide)
    for label in ("jax@cpu", "jax@cpu+float64", "numpy@cpu+float64", "oracle@cpu", "numpy@cpu~order1", "oracle@cpu~order1"):
        assert any(f" {label} " in line for line in table), (label, "\n".join(table))


def test_a_log_gets_a_progress_line_by_steps_and_at_least_every_ten_seconds(monkeypatch):
    import io

    from rich.console import Console

    from harness.run import progress

    clock = iter([0.0, 3.0, 14.0, 15.0, 40.0, 41.0, 42.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    buffer = io.StringIO()
    log = progress.printer(Console(file=buffer, width=100), "moons_net torch@cpu", 500, 1000)  # clock 0
    log(25, 0.9)  # 3 s: nothing
    log(50, 0.8)  # 14 s: a line (clock 15 is its stamp)
    log(75, 0.7)  # 40 s: a line
    log(500, 0.1)  # the last step: a line
    assert buffer.getvalue().splitlines() == [
        "  moons_net torch@cpu step 50/500 step loss 0.8",
        "  moons_net torch@cpu step 75/500 step loss 0.7",
        "  moons_net torch@cpu step 500/500 step loss 0.1",
    ]


def test_the_first_line_names_only_the_frameworks_that_run_here():
    """The default frameworks on --devices cpu: cupy runs on the GPU only, and is not named."""
    import io

    from rich.console import Console

    from harness.core.registry import ADAPTERS
    from harness.execute import plan

    out = io.StringIO()
    session.also_runs(list(ADAPTERS), plan.matrix_keys(list(ADAPTERS), ["cpu"]), Console(file=out, width=400))
    said = out.getvalue()
    assert said.startswith("besides torch, jax, numpy, this runs") and "cupy" not in said
    assert "(the float64 reference, recorded)" in said
    out = io.StringIO()  # --no-records: nothing is said to be recorded that is not
    session.also_runs(list(ADAPTERS), plan.matrix_keys(list(ADAPTERS), ["cpu"]), Console(file=out, width=400), ["p"], records=False)
    said = out.getvalue()
    assert "not recorded: --no-records" in said and ", recorded" not in said and "(recorded" not in said and "reference, recorded" not in said


def test_a_framework_that_did_not_run_is_said_in_the_summary(tmp_path, monkeypatch):
    """A framework missing from the environment (pip install '.[ray]' alone): its skip is a
    line of the run's summary, with the reason, not only a table row."""
    from types import SimpleNamespace

    from harness.report.table import skipped_runs

    def run(name, framework, status, reason=None):
        key = dict(framework=framework, device=SimpleNamespace(kind="cpu"), variant="", precision_mode="strict", mode="eager")
        return SimpleNamespace(spec=SimpleNamespace(name=name), status=status, reason=reason, **key)

    def result(name):
        return SimpleNamespace(records=[run(name, "torch", "skipped", "torch is not installed"), run(name, "numpy", "ok")], member_records=[])

    found = skipped_runs([result("peaks_mlp"), result("moons_net")])
    assert found == {"torch@cpu": (["peaks_mlp", "moons_net"], "torch is not installed")}


def test_offline_without_a_specs_data_the_other_specs_run(tmp_path):
    """Two specs, one whose data files are not in the data folder (offline, no download):
    that one is a SKIPPED line naming its spec and file and how to get it; the other runs;
    the summary counts the spec not run, and the exit code is 2 (bad input), not 0."""
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_DATA_DIR"}
    env["HOME"] = str(tmp_path)  # no ~/.cache/repro-harness/data
    empty = tmp_path / "data"
    empty.mkdir()
    mnist = tmp_path / "mnist_tiny.yaml"
    mnist.write_text((SPECS_DIR / "mnist_mlp.yaml").read_text())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            str(mnist),
            str(tiny_moons(tmp_path)),
            "--data-source",
            "train-set",  # asked for by name: the shipped test-set files do not stand in
            "--frameworks",
            "numpy",
            "--no-records",
            "--data-dir",
            str(empty),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        env=env,
    )
    said = " ".join(done.stdout.split())
    assert done.returncode == 2, done.stdout + done.stderr
    assert "SKIPPED mnist_mlp, its data is not here:" in said and "train-images-idx3-ubyte.gz: missing" in said and "--download" in said
    assert "moons_net numpy@cpu" in said and "1 spec(s) not run for want of their data: mnist_mlp" in said


def test_export_of_the_full_profile_says_it_trains_the_whole_run(tmp_path, capsys, monkeypatch):
    """The default profile is the full run (minutes of the oracle): said before it starts,
    with the spec's shorter profiles. The training itself is replaced here."""
    from harness import matrix
    from harness.spec.load import load_spec
    from tests.helpers import harness as in_process

    monkeypatch.setattr(matrix, "oracle_curve", lambda problem, out=None: np.zeros(problem.total_steps))
    code, out, err = in_process(capsys, "export", "peaks_mlp", "--out", tmp_path / "full.npz")
    assert code == 0, err
    others = [p for p in load_spec(SPECS_DIR / "peaks_mlp.yaml").spec.profiles]
    said = " ".join(out.split())
    assert "steps of the full profile" in said and f"--profile {' or '.join(others)}" in said
