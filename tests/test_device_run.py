"""tools/device-run.sh contact, the one call of a 15-minute GPU lease, rehearsed on this CPU
(REHEARSAL=1): every phase runs with a budget of its own, a phase that runs out ends with
timeout's 124 (or the harness's 130) and the next one runs, and $OUT gets only what the device tool brings back (at most 8
plain files, named in letters, digits, '.', '_' and '-')."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import tiny_moons

# the contact's phases, in the GPU issue's order (what landed since last)
PHASES = ["moons", "bench", "matrix", "references", "references-cpu", "port", "api", "smoke", "bf16", "seeds", "gpu-tests"]
PHASE = re.compile(r'^\s*phase (\S+) "\$\{\w+:-(\d+)\}"', flags=re.M)


def test_the_contacts_phases_come_in_the_gpu_issues_order_and_fit_one_call_with_time_for_the_archives():
    """Issue 51's priorities: moons_net first, then the bench's fast modes, the matrix, the
    references, a port, the Python API and the smoke's CuPy rows, then what landed since (bf16
    and the verdict over seeds on the GPU, issue 86); every phase's default budget, plus the 10 s
    each may take to die after its INT, inside the device's 600 s, with time for the archives."""
    phases = PHASE.findall((ROOT / "tools" / "device-run.sh").read_text())
    assert [name for name, _ in phases] == PHASES
    budgets = sum(int(seconds) for _, seconds in phases)
    assert (budgets, budgets + 10 * len(phases)) == (470, 580), phases  # the figures docs/gpu-machine.md gives


def uninstalled(folder: Path) -> dict[str, str]:
    """PATH and PYTHONPATH under which `python3` is this Python as the lent machine's is to the
    harness: its packages importable, the project not installed (this environment's editable
    install is a .pth file, which `-S` leaves unread), so that the checkout is found only as
    the contact's commands find it there."""
    folder.mkdir(exist_ok=True)
    shim = folder / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    shim.chmod(0o755)
    found = sysconfig.get_paths()
    paths = dict.fromkeys([found["purelib"], found["platlib"], *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    env = {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": os.pathsep.join(paths)}
    probe = subprocess.run(["python3", "-c", "import harness"], cwd=folder, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    if "No module named 'harness'" not in probe.stderr:
        pytest.skip(f"the harness imports without its editable install (installed in {found['purelib']}?): not the lent machine's case")
    return env


def test_the_api_phase_finds_the_harness_in_a_checkout_that_is_not_installed(tmp_path):
    """The contact's `python3 tools/api_contact.py` on the lent machine, where the project is a
    checkout, not installed: it found no `harness` (sys.path holds tools/, not the root) and
    would have ended the API's phase with a traceback; now it gets as far as its arguments'
    check (an unknown device: one line, exit 2), from another folder too."""
    env = {**os.environ, **uninstalled(tmp_path / "bin")}
    command = ["python3", str(ROOT / "tools" / "api_contact.py"), "--devices", "nowhere", "--results", str(tmp_path)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip() == "tools/api_contact.py: devices: unknown 'nowhere'; choose from cpu, gpu", done.stderr


@pytest.mark.slow  # a minute of fresh processes: `nox -s slow`
def test_the_contact_call_rehearsed_runs_every_phase_in_its_budget_and_leaves_what_comes_back(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("flax", reason="flax is not installed")
    if shutil.which("timeout") is None or shutil.which("tar") is None:
        pytest.skip("needs coreutils' timeout and tar")
    spec = tiny_moons(tmp_path, profiles={name: {"training": {"epochs": 3}} for name in ("quick", "bench")})
    out, carry, results = tmp_path / "out", tmp_path / "carry", tmp_path / "records"
    out.mkdir()
    env = {
        **os.environ,
        **uninstalled(tmp_path / "bin"),  # python3: this Python, the project not installed, as on the lent machine
        "OUT": str(out),
        "CARRY": str(carry),
        "RESULTS": str(results),
        "REHEARSAL": "1",
        "MOONS_S": "240",  # moons_net first: here the tiny moons at its quick size
        "MOONS_SPECS": str(spec),
        "SMOKE_S": "3",  # runs out: interrupted, most likely before its first row (then it writes no JSON)
        "SMOKE_FRAMEWORKS": "torch,jax,numpy",  # (the contact's default, CuPy, runs on a GPU only)
        "SMOKE_SPECS": str(spec),
        "MATRIX_S": "240",
        "MATRIX_SPECS": str(spec),
        "REFS_S": "240",  # the references on the GPU: here NumPy's on the CPU, as a rehearsal cannot do otherwise
        "REFS_CPU_S": "240",  # ... and the CPU's, judging the same run
        "REFS_SPECS": str(spec),
        "REFS_PROFILE": "quick",
        "PORT_S": "3",  # runs out too: a user's port, interrupted, keeps what it finished
        "PORT_SPECS": "examples/mlp_port/mlp_port.yaml",
        "API_S": "240",  # the Python API's port example, the slip and the honest port, on the CPU
        "BENCH_S": "240",
        "BENCH_SPECS": str(spec),
        "BF16_S": "240",  # torch's autocast and flax in bfloat16 (here on the CPU), their envelope's members
        "BF16_SPECS": str(spec),
        "SEEDS_S": "240",  # the verdict over seeds, 5 seeds
        "SEEDS_SPECS": str(spec),
        "TESTS_S": "120",
        "TESTS": "tests/test_smoke.py",
    }
    done = subprocess.run(["bash", "tools/device-run.sh", "contact"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    log = (out / "contact.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "REHEARSAL" in done.stdout
    codes = dict(re.findall(r"^== (\S+): exit code (\d+) after", log, flags=re.M))
    assert list(codes) == PHASES, log
    assert codes["smoke"] in ("130", "124") and codes["port"] in ("130", "124"), log
    assert {codes[name] for name in ("moons", "matrix", "references", "references-cpu", "bench", "api", "bf16", "seeds")} == {"0"}, log
    assert "== api_port_slip on cpu: " in log and "expected: fails as implementation at norm; as expected" in log, log
    assert codes["gpu-tests"] == "5", log  # no test of test_smoke.py is marked gpu: none collected

    files = sorted(p.name for p in out.rglob("*"))
    assert set(files) <= {"contact.log", "smoke.json", "pytest-gpu.xml", "records.tar.gz", "work.tar.gz"} and len(files) <= 8
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    if (out / "smoke.json").exists():  # interrupted before its first group: no rows, but never half a file
        assert json.loads((out / "smoke.json").read_text())["interrupted"] is True
    with tarfile.open(out / "records.tar.gz") as archive:
        records = [m.name for m in archive.getmembers() if m.name.endswith(".json")]
    # the matrix's, the references phase's and the bench's; the same run judged by the CPU's
    # references in a folder of their own
    mine = [name for name in records if name.startswith(f"{results.name}/")]
    assert all(any(f"_{profile}_" in name for name in mine) for profile in ("full", "quick", "bench")), records
    assert any(name.startswith(f"{results.name}/api_port/") for name in records), records  # check_port's
    assert any(name.startswith(f"{results.name}/api_port_slip/") for name in records), records
    apart = [name for name in records if name.startswith(f"{results.name}-cpu-references/")]
    assert apart and all("_quick_" in name for name in apart), records
    with tarfile.open(out / "work.tar.gz") as archive:
        assert any(m.name.startswith("work/") for m in archive.getmembers())
