"""The harness from Python (issue 53, harness/api.py): `harness.run_spec` gives the matrix,
checks and verdicts `harness run` gives, as a Verdict; bad arguments raise harness.SpecError
(a ValueError) in one line naming the argument and the key, before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import harness
from harness.records.store import read_record
from harness.result import diagnosis_kind, named_module
from tests.conftest import ROOT
from tests.helpers import interruptible, tiny_moons


def test_run_spec_gives_the_verdict_and_records_harness_run_gives(tmp_path):
    """The same tiny spec from a path, by `harness run` and by harness.run_spec: the same
    records, check for check (errors, ratios, diagnoses) and loss curve for loss curve,
    bitwise; the Verdict passes, its text is the table, and its records are the schema's."""
    spec = tiny_moons(tmp_path)
    cli_dir, api_dir = tmp_path / "cli", tmp_path / "api"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(spec), "--frameworks", "numpy", "--results", str(cli_dir), "--no-floor"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = harness.run_spec(spec, frameworks=["numpy"], results=api_dir)
    assert verdict.passed and verdict.failures == [] and "Verdicts" in str(verdict) and "numpy@cpu" in str(verdict)
    assert {(r["framework"], r["precision_mode"]) for r in verdict.records} == {("numpy", "strict"), ("oracle", "strict"), ("numpy", "float64")}
    cli = {(r.framework, r.precision_mode): r for r in map(read_record, (cli_dir / "moons_net").glob("*.json"))}
    api = {(r.framework, r.precision_mode): r for r in map(read_record, (api_dir / "moons_net").glob("*.json"))}
    assert cli.keys() == api.keys()
    for key in cli:
        a, b = cli[key].model_dump(mode="json"), api[key].model_dump(mode="json")
        assert a["checks"] == b["checks"], key
        curves = [
            np.load(folder / "moons_net" / r.artifacts.file, allow_pickle=False)["losses"] for folder, r in ((cli_dir, cli[key]), (api_dir, api[key]))
        ]
        assert np.array_equal(curves[0], curves[1]), key


def test_run_spec_takes_a_dict_and_writes_nothing_without_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = yaml.safe_load(tiny_moons(tmp_path).read_text())
    verdict = harness.run_spec(doc, frameworks="numpy")
    assert verdict.passed and len(verdict.records) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_moons.yaml"]  # nothing written


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"frameworks": ["torch", "tensorflow"]}, "frameworks: unknown 'tensorflow'; choose from"),
        ({"devices": ["tpu"]}, "devices: unknown 'tpu'; choose from"),
        ({"frameworks": 3}, "frameworks: a list of names"),
        ({"results": 3}, "results: a folder's path"),
        ({"profile": 3}, "profile: a profile's name"),
        ({"profile": "tiny"}, "profile 'tiny' is not defined"),
    ],
)
def test_bad_arguments_raise_spec_error_in_one_line_before_anything_runs(tmp_path, kwargs, said):
    with pytest.raises(harness.SpecError, match=said) as caught:
        harness.run_spec(tiny_moons(tmp_path), **kwargs)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"modes": ["eager", "quick"]}, "modes: unknown 'quick'"),
        ({"references": "tpu"}, "references: choose from"),
        ({"repeats": 0}, "repeats: a whole number from 1"),
        ({"jobs": True}, "jobs: a whole number"),
        ({"work_dir": 3}, "work_dir: a folder's path"),
        ({"train_anyway": "yes"}, "train_anyway: True or False"),
    ],
)
def test_run_options_are_validated_once_where_they_are_made(kwargs, said):
    """The core's typed options (harness/options.py): a bad value is a SpecError in one line
    naming the option, whoever builds them."""
    from harness.options import RunOptions

    with pytest.raises(harness.SpecError, match=said) as caught:
        RunOptions(**kwargs)
    assert "\n" not in str(caught.value)


def test_the_command_line_parses_into_the_options_the_api_builds(tmp_path):
    """`harness run`'s argv parsed (harness/arguments.py) into RunOptions gives the same value
    as the API's keywords: the CLI is a skin on the typed core."""
    from harness import arguments
    from harness.options import RunOptions

    argv = ["run", "peaks_mlp", "--profile", "quick", "--frameworks", "torch,jax,jax", "--no-records", "--work-dir", str(tmp_path), "--repeats", "2"]
    parsed = RunOptions.from_args(arguments.parser("harness").parse_args(argv))
    built = RunOptions(specs=["peaks_mlp"], profile="quick", frameworks=["torch", "jax"], results=None, work_dir=str(tmp_path), repeats=2)
    assert parsed == built and parsed.running == ["torch", "jax"] and RunOptions().results is not None
    assert RunOptions.from_args(arguments.parser("harness").parse_args(["run"])) == RunOptions()


def test_a_bad_spec_dict_names_its_key(tmp_path):
    doc = yaml.safe_load(tiny_moons(tmp_path).read_text())
    doc["optimizer"]["lrr"] = 0.1
    with pytest.raises(harness.SpecError, match=r"<spec>: optimizer") as caught:
        harness.run_spec(doc)
    assert "\n" not in str(caught.value)
    with pytest.raises(harness.SpecError, match="spec: a path, a spec's name or a dict"):
        harness.run_spec(42)
    with pytest.raises(harness.SpecError, match="unknown spec 'no_such_spec'"):
        harness.run_spec("no_such_spec")


def test_a_failures_fields_read_off_its_diagnosis():
    text = (
        "implementation: the float64 twin of jax@cpu differs from torch@cpu+float64 too (math_initial_outputs, 2.3e+09x its "
        "tolerance); its forward pass first differs at module norm (the first batch); starts at step 0"
    )
    assert diagnosis_kind(text) == "implementation" and named_module(text, "fc2.weight") == "norm"
    assert named_module("rounding: float32 only, 2.02x; largest in dense1.weight after step 10 (3x)", None) == "dense1"
    assert diagnosis_kind("known (optax-adam-float32-bias-corrections, 0.1 of what it explains)") == "known"
    assert named_module("rounding: float32 only", None) is None


def test_a_script_calling_run_spec_without_a_main_guard_is_told_to_add_one_at_once(tmp_path):
    """A script that calls harness.run_spec at its top level: each worker process imports it
    again (spawn) and would call it again. The call stops at the first worker with a
    RuntimeError of one line saying to put it under the main guard; never "process died",
    never a Verdict of failed runs."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import harness\n"
        "try:\n"
        "    verdict = harness.run_spec('peaks_mlp', profile='quick', frameworks=['numpy'])\n"
        "    print('a verdict:', verdict.passed, verdict.failures)\n"
        "except RuntimeError as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}')\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=_with_harness(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"UnguardedMain: {script}: calls the harness at its top level, and each worker process (multiprocessing's spawn start) "
        'imports it again there: put the call under `if __name__ == "__main__":`\n'
    )
    assert "process died" not in done.stdout + done.stderr and "Traceback" not in done.stderr, done.stderr


def test_ctrl_c_during_run_spec_is_a_keyboard_interrupt_in_the_caller(tmp_path):
    """SIGINT to the caller's process group while a job's process trains: run_spec raises
    KeyboardInterrupt in the caller, with no worker's traceback printed."""
    import signal

    spec = tiny_moons(tmp_path, training__epochs=3000, checks__params_after_steps__step=10, logging={"loss_every": 1, "print_every": 100})
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import sys\n"
        "import harness\n"
        "if __name__ == '__main__':\n"
        "    try:\n"
        "        harness.run_spec(sys.argv[1], frameworks=['numpy'])\n"
        "        print('finished')\n"
        "    except KeyboardInterrupt:\n"
        "        print('KeyboardInterrupt')\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-u", str(script), str(spec)],
        cwd=tmp_path,
        env=_with_harness(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=interruptible,
    )
    for line in run.stdout:  # a worker's progress reaches the caller's stdout
        if "numpy@cpu step 100/3000" in line:
            os.killpg(run.pid, signal.SIGINT)
            break
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0 and out.splitlines()[-1] == "KeyboardInterrupt" and "Traceback" not in err, out + err


def _with_harness() -> dict[str, str]:
    """This process's environment, with this checkout on the path of a script run elsewhere."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_a_verdict_not_passed_names_each_failed_run_among_its_failures():
    """A run that failed (it raised, or its process died) fails the verdict and is one of its
    failures, with its reason: no Verdict is not passed with no failures."""
    from types import SimpleNamespace

    from harness.records.store import run_label
    from harness.result import RUN_CHECK, RUN_FAILED, Verdict

    record = read_record(next((ROOT / "baselines" / "cpu-quick").rglob("*.json")))
    reason = f"{run_label(record)}: the run's process died (killed, or out of memory)"
    died = record.model_copy(update={"status": "failed", "reason": reason, "failed_at_step": None, "checks": []})
    verdict = Verdict([SimpleNamespace(records=[record, died], member_records=[])], "")
    assert not verdict.passed
    found = [(f.check, f.run, f.reference, f.diagnosis, f.detail) for f in verdict.failures]
    assert found == [(RUN_CHECK, run_label(died), None, RUN_FAILED, reason)]
    assert Verdict([SimpleNamespace(records=[record], member_records=[died])], "").failures[0].detail == reason  # a member's too


def test_importing_harness_imports_no_framework():
    code = "import sys, harness; harness.SpecError; assert not {'torch', 'jax', 'cupy'} & set(sys.modules), sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_run_spec_on_peaks_quick_passes_with_torchs_and_jaxs_records():
    """The issue's own example: peaks' quick profile in torch and JAX, from Python."""
    pytest.importorskip("jax")
    verdict = harness.run_spec(ROOT / "specs" / "peaks_mlp.yaml", profile="quick", frameworks=["torch", "jax"])
    assert verdict.passed, str(verdict)
    assert {"torch", "jax"} <= {r["framework"] for r in verdict.records}


def _port_slipped_on_flax(order: int = 1, said=lambda c: c.diagnosis, status: str = "ok"):
    """A port's committed records (examples/results/mlp_port), every check of flax's runs
    made to fail, as a slip on flax's side does, its diagnosis `said(check)`; in the records'
    order, or reversed (-1); each run's status `status` (skipped: with the reason a port not
    trained has)."""
    from types import SimpleNamespace

    from harness.core.registry import CheckVerdict
    from harness.records.store import load_records, run_label

    records = []
    for record in load_records(ROOT / "examples" / "results" / "mlp_port").values():
        mine = run_label(record).startswith("jax")
        failing = [c.model_copy(update={"verdict": CheckVerdict.FAIL}) if mine or c.against.startswith("jax") else c for c in record.checks]
        checks = [c.model_copy(update={"diagnosis": said(c)}) if c.verdict == CheckVerdict.FAIL else c for c in failing]
        reason = None if status == "ok" else "not trained: flax's initial forward pass differs from torch's"
        records.append(record.model_copy(update={"checks": checks, "status": status, "reason": reason}))
    return [SimpleNamespace(title="mlp_port", records=records[::order], member_records=[])]


@pytest.mark.parametrize("order", [1, -1], ids=["as_loaded", "reversed"])
def test_a_failure_names_the_run_judged_and_its_reference_whatever_the_records_order(order):
    """Issue 84: a port's math checks said `.run` torch@cpu+float64 and `.reference`
    jax@cpu+float64, the first record carrying a check taken for its run. The reference is
    torch's float64 run (registry.PORT_REFERENCE_KEY) and the run judged flax's, in
    `.failures` and in the FAIL lines alike, whichever record comes first."""
    from harness.result import Verdict, rendered

    results = _port_slipped_on_flax(order)
    verdict = Verdict(results, rendered(results))
    pairs = {(f.run, f.reference) for f in verdict.failures}
    assert pairs == {("jax@cpu", "torch@cpu"), ("jax@cpu", "torch@cpu+float64"), ("jax@cpu+float64", "torch@cpu+float64")}, pairs
    said = " ".join(str(verdict).split())
    assert "torch@cpu+float64 vs jax" not in said and "torch@cpu vs jax" not in said, said


def _bn_slip(c) -> str:
    """A diagnosis as a slip in one module gives them: the tensor checks name `norm`, the
    others no module, and one check, math_final_outputs, a second module (`fc2`)."""
    if c.name == "math_final_outputs":
        return "implementation: different math; its forward pass first differs at module fc2 (the first batch)"
    return "implementation: different math" + ("; largest in norm.scale after step 1" if c.tensor else "")


def test_a_slip_leads_with_one_fail_line_per_cause_and_counts_the_rest():
    """Issue 84: a batch-norm momentum slip gave 16 FAIL lines, 15 naming bn1 and one no
    module. The text leads with one line per cause (the first failing check of each module
    named; a check naming none goes with its run's cause of the same diagnosis), then a
    count of the rest; `.failures` and the records keep every one."""
    from harness.result import Verdict, rendered

    results = _port_slipped_on_flax(said=_bn_slip)
    verdict = Verdict(results, rendered(results))
    said = " ".join(str(verdict).split())
    assert said.count("FAIL mlp_port ") == 2 and "largest in norm.scale" in said and "first differs at module fc2" in said, said
    more = len(verdict.failures) - 2
    assert more > 10 and f"... and {more} more failing checks of the same causes: see .failures" in said, said
    assert {f.module for f in verdict.failures} == {"norm", "fc2", None}
    assert sum(c["verdict"] == "fail" for r in verdict.records for c in r["checks"]) == 2 * len(verdict.failures)  # both runs of each pair


def test_a_port_not_trained_says_its_skipped_runs_once():
    """Issue 84: a port failing its initial forward pass printed its SKIPPED runs in the FAIL
    lines' block and again in the command line's summary. Once, in both texts."""
    import argparse
    import io

    from rich.console import Console

    from harness import cli
    from harness.core.registry import RunKey
    from harness.records.store import run_label
    from harness.result import rendered
    from harness.run.runner import Outcome

    results = _port_slipped_on_flax(status="skipped")
    for result in results:  # the matrix's result: each run's outcome beside its record
        result.loaded = result
        result.name = result.title
        keys = [RunKey.from_label(run_label(r)) for r in result.records]
        result.outcomes = {key: Outcome(key, "skipped", r.reason) for key, r in zip(keys, result.records)}
    out = io.StringIO()
    cli._finish_run(argparse.Namespace(), Console(file=out, width=100), results, None, "run")
    for text in (out.getvalue(), rendered(results)):
        said = " ".join(text.split())
        assert said.count("SKIPPED") == 1 and "not trained" in said, said
