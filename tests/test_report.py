"""`harness report`: REPORT.md and its figures from fixture records, with no training.

The fixtures are the committed CPU records of peaks and moons, rewritten in tmp_path: made
into GPU records (scaled timings, perturbed losses), failed or skipped runs, a failing
check, or sweep points. Each record points at the spec in specs/ today, with its sha256.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from harness import cli
from harness.core import registry
from harness.core.paths import SPECS_DIR
from harness.core.registry import CheckVerdict
from harness.inputs.problem import from_named
from harness.records import store
from harness.records.schema import Device, Record
from harness.records.store import read_record
from harness.records.write import artifact_bytes, write_record
from harness.report import document as report
from harness.report import rows
from harness.report.speed import speed_rows
from tests.conftest import ROOT

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FRAMEWORKS = (*(f for f in registry.ADAPTERS if registry.runs_on(f, "cpu")), registry.ORACLE)


def committed(spec: str, framework: str) -> tuple[Record, dict[str, np.ndarray]]:
    """A committed full-profile CPU record and its artifact, as a template."""
    candidates = [r for r in map(store.read, (ROOT / "results" / spec).glob("*_cpu_full_*.json")) if r.framework == framework]
    record = max((r for r in candidates if r.precision_mode == "strict" and r.mode == "eager"), key=lambda r: (r.created, r.record_id))
    path = next((ROOT / "results" / spec).glob(f"*_{record.record_id}.json"))
    with np.load(path.with_suffix(".npz")) as npz:
        return record, {k: npz[k] for k in npz.files}


def fake(
    results: Path,
    spec: str,
    framework: str,
    device: str = "cpu",
    *,
    time_scale: float = 1.0,
    transfer_s: float | None = None,
    perturb: float = 0.0,
    profile: str = "full",
    overrides: dict | None = None,
    n_train: int | None = None,
    envelope: np.ndarray | None = None,
    **update,
) -> Record:
    """Write one fixture record (and its .npz) under results; return it as written."""
    template, arrays = committed(spec, "numpy" if framework == "cupy" else framework)  # the same code on the GPU
    spec_file = SPECS_DIR / f"{spec}.yaml"
    timings = template.timings.model_copy(
        update={
            "per_step_s": template.timings.per_step_s * time_scale,
            "train_s": template.timings.train_s * time_scale,
            "transfer_s": template.timings.transfer_s if transfer_s is None else transfer_s,
        }
    )
    ident = hashlib.sha256(repr((spec, framework, device, profile, n_train, sorted(update))).encode()).hexdigest()[:12]
    record = template.model_copy(
        update={
            "record_id": ident,
            "run_id": "fixture0run",
            "framework": framework,
            "spec": template.spec.model_copy(
                update={
                    "path": str(spec_file),
                    "sha256": hashlib.sha256(spec_file.read_bytes()).hexdigest(),
                    "profile": profile,
                    "overrides": overrides or {},
                }
            ),
            "device": Device(kind=device, name="Fake GPU" if device == "gpu" else "x86_64"),
            "data": template.data.model_copy(update={"n_train": n_train or template.data.n_train}),
            "timings": timings,
            **update,
        }
    )
    losses = arrays["losses"] * (1 + perturb * np.cos(np.arange(len(arrays["losses"]))))
    params = from_named(arrays)
    if record.status != "ok":
        record = record.model_copy(update={"timings": None, "metrics": None, "checks": [], "artifacts": None})
        path = write_record(results, record)
    else:
        path = write_record(results, record, artifact_bytes(losses, params, envelope if envelope is not None else arrays.get("envelope")))
    return read_record(path)


def build(results: Path, profile: str = "full") -> tuple[str, Path]:
    assert cli.main(["report", "--results", str(results), "--profile", profile]) == 0
    out = results / "REPORT.md"
    return out.read_text(), out


def figure_paths(text: str, out: Path) -> list[Path]:
    return [out.parent / rel for rel in re.findall(r"\]\((figures/[^)]+\.png)\)", text)]


def section(text: str, title: str) -> str:
    return text.split(f"## {title}")[1].split("\n## ")[0]


@pytest.fixture(scope="module")
def cpu_only(tmp_path_factory) -> tuple[str, Path]:
    results = tmp_path_factory.mktemp("cpu_only")
    for framework in FRAMEWORKS:
        fake(results, "peaks_mlp", framework)
    return build(results)


def test_cpu_only_gpu_columns_say_not_run(cpu_only):
    text, _ = cpu_only
    speed = section(text, "Speed")
    rows = [line for line in speed.splitlines() if line.startswith("| peaks_mlp")]
    assert len(rows) == 3  # torch, jax, numpy: the oracle is no speed contestant
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == "eager", row  # the mode
        assert cells[7:12] == ["not run", "-", "not run", "not run", "not run"], row  # GPU ms/step, its floor ratio, precision, speedups
        assert cells[12] == "200x"  # the claim, from specs/peaks_mlp.yaml
    assert "No GPU records" in speed


def test_cpu_only_peaks_figure_falls_back_to_two_frameworks(cpu_only):
    text, out = cpu_only
    articles = section(text, "The articles' figures, from our runs")
    assert "no GPU records: the CPU-trained nets of two frameworks (torch, jax)" in articles
    assert (out.parent / "figures" / "peaks_peaks_mlp.png").read_bytes().startswith(PNG_MAGIC)
    verdicts = section(text, "Verdicts")
    assert "| peaks_mlp | torch | cpu | strict | eager | float32 | ok |" in verdicts
    # the list of failing and known checks is exactly what the records carry
    carried = [read_record(p) for p in out.parent.rglob("*.json")]
    known = {c.name for r in carried for c in r.checks if c.verdict == "known"}
    failing = {c.name for r in carried for c in r.checks if c.verdict == "fail"}
    assert ("- none" in verdicts) == (not known and not failing)
    assert all(f": {name}:" in verdicts for name in known | failing)
    assert verdicts.count("**KNOWN**") >= len(known) and verdicts.count("**FAIL**") >= len(failing)


def test_gpu_records_give_the_expected_speedups(tmp_path):
    cpu = fake(tmp_path, "peaks_mlp", "torch")
    gpu = fake(tmp_path, "peaks_mlp", "torch", "gpu", time_scale=0.1, transfer_s=0.5, perturb=1e-6)
    jax_cpu = fake(tmp_path, "peaks_mlp", "jax")
    jax_tf32 = fake(tmp_path, "peaks_mlp", "jax", "gpu", time_scale=0.25, perturb=1e-5, precision_mode="tf32")
    fake(tmp_path, "peaks_mlp", "oracle")
    text, out = build(tmp_path)

    by_framework = {row.cell.framework: row for row in speed_rows([cpu, gpu, jax_cpu, jax_tf32])}
    assert by_framework["torch"].speedup == pytest.approx(10.0)
    with_transfers = (cpu.timings.transfer_s + cpu.timings.train_s) / (0.5 + gpu.timings.train_s)
    assert by_framework["torch"].speedup_with_transfers == pytest.approx(with_transfers)
    assert by_framework["jax"].speedup == pytest.approx(4.0)
    speed = section(text, "Speed")
    torch_row = next(line for line in speed.splitlines() if line.startswith("| peaks_mlp | torch"))
    assert "| 10x |" in torch_row and f"| {with_transfers:.3g}x |" in torch_row
    jax_rows = [line for line in speed.splitlines() if line.startswith("| peaks_mlp | jax")]
    assert len(jax_rows) == 2  # the strict GPU run is not there, the TF32 one is
    assert "| not run | - | not run | not run | not run |" in jax_rows[0]
    assert "| tf32 | 4x |" in jax_rows[1]
    assert "not run" not in torch_row
    assert "the CPU-trained and the GPU-trained net of one framework" in text
    _, between = rows.curve_pairs(store.newest_per_cell([cpu, gpu, jax_cpu, jax_tf32]))
    labels = {(store.run_label(a), store.run_label(b)) for a, b in between}
    assert ("torch@cpu", "torch@gpu") in labels and ("jax@cpu", "jax@gpu+tf32") in labels
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in figure_paths(text, out))


def test_failed_check_and_skipped_run_are_visible(tmp_path):
    template, _ = committed("peaks_mlp", "torch")
    checks = [
        c.model_copy(update={"verdict": CheckVerdict.FAIL}) if c.name == "initial_loss" and c.against == "oracle@cpu" else c for c in template.checks
    ]
    fake(tmp_path, "peaks_mlp", "torch", checks=checks)
    fake(tmp_path, "peaks_mlp", "oracle")
    fake(tmp_path, "peaks_mlp", "jax", status="failed", reason="RuntimeError: the adapter crashed at step 7")
    fake(tmp_path, "peaks_mlp", "cupy", "gpu", status="skipped", reason="no usable CUDA GPU: cupy is not installed")
    text, _ = build(tmp_path)
    verdicts = section(text, "Verdicts")
    assert "| peaks_mlp | torch | cpu | strict | eager | float32 | **ok, 1 check FAIL** |" in verdicts
    assert "| peaks_mlp | jax | cpu | strict | eager | float32 | **FAILED** |" in verdicts
    assert "| peaks_mlp | cupy | gpu | strict | eager | float32 | *skipped* |" in verdicts
    assert "- **FAILED** peaks_mlp jax@cpu: RuntimeError: the adapter crashed at step 7" in verdicts
    assert "- **SKIPPED** peaks_mlp cupy@gpu: no usable CUDA GPU: cupy is not installed" in verdicts
    assert "- **FAIL** peaks_mlp torch@cpu vs oracle@cpu: initial_loss" in verdicts
    torch_row = next(line for line in verdicts.splitlines() if line.startswith("| peaks_mlp | torch"))
    passed = sum(c.verdict == "pass" for c in checks)
    known = sum(c.verdict == "known" for c in checks)
    assert f"| **{passed} / 1 / {known} / 0** |" in torch_row  # pass / fail / known / skipped, the failure in bold
    jax_speed = next(line for line in section(text, "Speed").splitlines() if line.startswith("| peaks_mlp | jax"))
    assert "| failed |" in jax_speed


def test_sweep_records_are_drawn_against_data_size(tmp_path):
    sizes = (10, 20, 50)
    for framework in ("torch", "jax"):
        for points in sizes:
            overrides = {"training": {"epochs": 100}, "data": {"points_per_axis": points}}
            fake(tmp_path, "peaks_mlp", framework, profile="sweep", overrides=overrides, n_train=points**2, time_scale=points / 200)
    text, out = build(tmp_path)
    assert "No records of profile `full`." in section(text, "Verdicts")
    sweep = section(text, "Crossover sweep")
    rows = [line for line in sweep.splitlines() if line.startswith("| peaks_mlp")]
    assert [row.split("|")[5].strip() for row in rows] == ["100", "100", "400", "400", "2,500", "2,500"]
    assert all("| not run | - | not run | not run | not run |" in row for row in rows)
    assert "speedup not run" in sweep
    assert (out.parent / "figures" / "sweep_peaks_mlp.png").read_bytes().startswith(PNG_MAGIC)


def test_sweep_with_a_gpu_point_plots_speedup(tmp_path):
    overrides = {"training": {"epochs": 100}, "data": {"points_per_axis": 20}}
    for device, scale in (("cpu", 1.0), ("gpu", 0.5)):
        fake(tmp_path, "peaks_mlp", "torch", device, profile="sweep", overrides=overrides, n_train=400, time_scale=scale)
    text, _ = build(tmp_path, profile="sweep")
    sweep = section(text, "Crossover sweep")
    assert "| 2x |" in sweep and "speedup GPU/CPU (right)" in sweep
    assert "| peaks_mlp | torch | gpu |" in section(text, "Verdicts")  # --profile sweep: the main tables too


def test_empty_folder_exits_two_with_one_line(tmp_path, capsys):
    assert cli.main(["report", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no records" in err and str(tmp_path) in err and len(err.splitlines()) == 1
    assert not (tmp_path / "REPORT.md").exists()


def test_report_is_deterministic_and_every_png_is_there(tmp_path):
    results = tmp_path / "results"
    for framework in ("torch", "oracle"):
        fake(results, "moons_net", framework)
    fake(results, "peaks_mlp", "torch")
    fake(results, "peaks_mlp", "jax")
    text, out = build(results)
    pngs = {p.name: p.read_bytes() for p in figure_paths(text, out)}
    assert pngs and all(payload.startswith(PNG_MAGIC) for payload in pngs.values())
    assert sorted(pngs) == sorted(p.name for p in (out.parent / "figures").iterdir() if p.name != report.WRITTEN)
    assert {"moons_moons_net.png", "peaks_peaks_mlp.png", "divergence_moons_net.png", "speedup.png"} <= set(pngs)
    again, _ = build(results)
    assert again == text
    assert {p.name: p.read_bytes() for p in figure_paths(again, out)} == pngs
    assert not [p for p in out.parent.rglob(".*") if p.name != report.WRITTEN]  # no temporary file left


def test_a_report_removes_only_the_figures_it_wrote(tmp_path):
    """`report --out X/REPORT.md` into a folder that holds the user's own files: they stay;
    a figure an earlier report wrote and this one does not is removed."""
    results = tmp_path / "results"
    fake(results, "peaks_mlp", "torch")
    out = tmp_path / "mine" / "REPORT.md"
    figures = out.parent / "figures"
    figures.mkdir(parents=True)
    (figures / "my_plot.png").write_bytes(b"mine")
    (out.parent / "notes.txt").write_text("mine")
    assert cli.main(["report", "--results", str(results), "--out", str(out)]) == 0
    written = set((figures / report.WRITTEN).read_text().split())
    assert written and (figures / "my_plot.png").read_bytes() == b"mine" and (out.parent / "notes.txt").read_text() == "mine"
    (figures / report.WRITTEN).write_text("".join(f"{n}\n" for n in [*written, "gone_figure.png"]))
    (figures / "gone_figure.png").write_bytes(b"an earlier report's")
    assert cli.main(["report", "--results", str(results), "--out", str(out)]) == 0
    assert not (figures / "gone_figure.png").exists() and (figures / "my_plot.png").read_bytes() == b"mine"


def test_report_out_is_a_folder_or_a_markdown_file(tmp_path, capsys):
    """--out DIR (there or not) gets DIR/REPORT.md and DIR/figures/; --out X.md is the file,
    figures/ beside it; --out naming a file that is not Markdown is one line, exit 2."""
    results = tmp_path / "results"
    fake(results, "peaks_mlp", "torch")
    existing = tmp_path / "existing"
    existing.mkdir()
    for folder in (existing, tmp_path / "new" / "folder"):
        assert cli.main(["report", "--results", str(results), "--out", str(folder)]) == 0
        assert (folder / "REPORT.md").is_file() and (folder / "figures" / report.WRITTEN).is_file()
    named = tmp_path / "elsewhere" / "mine.md"
    named.parent.mkdir()
    assert cli.main(["report", "--results", str(results), "--out", str(named)]) == 0
    assert named.is_file() and (named.parent / "figures").is_dir()
    other = tmp_path / "notes.txt"
    other.write_text("mine")
    assert cli.main(["report", "--results", str(results), "--out", str(other)]) == 2
    assert "neither a Markdown file (.md) nor a folder" in capsys.readouterr().err and other.read_text() == "mine"


def test_report_picks_the_one_profile_the_records_hold_or_says_which(tmp_path, capsys):
    """`report --results runs` after a quick run reports the quick profile and says so; a
    profile the records do not hold is one line and exit 2, naming what they hold."""
    results = tmp_path / "results"
    fake(results, "peaks_mlp", "torch", profile="quick")
    fake(results, "peaks_mlp", "oracle", profile="quick")
    assert cli.main(["report", "--results", str(results)]) == 0
    assert "(profile quick)" in capsys.readouterr().out
    assert "## Verdicts" in (results / "REPORT.md").read_text() and "No records of profile" not in (results / "REPORT.md").read_text()
    assert cli.main(["report", "--results", str(results), "--profile", "full"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the records hold profiles quick" in err
    fake(results, "peaks_mlp", "torch", profile="full")  # one full record: the main tables are full's, the quick ones said
    assert cli.main(["report", "--results", str(results)]) == 0
    said = capsys.readouterr().out
    assert "(profile full)" in said and "not in its main tables: 2 record(s) of profile quick (--profile quick reports them)" in said
    report = " ".join((results / "REPORT.md").read_text().split())
    assert "Records left out of the main tables: 2 of profile `quick` (`--profile quick` reports them)." in report


def test_a_tampered_artifact_is_named_and_its_figures_skipped(tmp_path):
    record = fake(tmp_path, "peaks_mlp", "torch")
    fake(tmp_path, "peaks_mlp", "jax")
    npz = next(tmp_path.rglob(f"*{record.record_id}.npz"))
    npz.write_bytes(npz.read_bytes() + b"x")
    text, _ = build(tmp_path)
    assert f"{npz.name}: sha256 differs from the record's" in text


def test_a_truncated_artifact_whose_sha256_was_updated_is_named_not_a_traceback(tmp_path):
    record = fake(tmp_path, "peaks_mlp", "torch")
    fake(tmp_path, "peaks_mlp", "jax")
    npz = next(tmp_path.rglob(f"*{record.record_id}.npz"))
    npz.write_bytes(npz.read_bytes()[:200])
    path = next(tmp_path.rglob(f"*{record.record_id}.json"))
    updated = record.artifacts.model_copy(update={"sha256": hashlib.sha256(npz.read_bytes()).hexdigest()})
    path.write_text(record.model_copy(update={"artifacts": updated}).model_dump_json(indent=2))
    text, _ = build(tmp_path)
    assert f"{npz.name}: not a readable .npz (BadZipFile" in text


def test_a_spec_that_cannot_be_found_skips_its_figures_with_the_reason(tmp_path):
    for framework in ("torch", "jax"):
        template, _ = committed("peaks_mlp", framework)
        lost = template.spec.model_copy(update={"path": "/nowhere/peaks_mlp.yaml", "sha256": "0" * 64})
        fake(tmp_path, "peaks_mlp", framework, git=template.git.model_copy(update={"commit": None}))
        record = max(tmp_path.rglob(f"*_{framework}_cpu_*.json"))
        record.write_text(read_record(record).model_copy(update={"spec": lost}).model_dump_json(indent=2))
    text, _ = build(tmp_path)
    assert "*Not drawn (peaks_peaks_mlp): the spec file /nowhere/peaks_mlp.yaml with sha256 000000000000..." in text
    assert "| peaks_mlp | torch | cpu |" in section(text, "Verdicts")  # the tables do not need the spec


def test_the_committed_records_find_their_spec_in_git(tmp_path):
    template, _ = committed("peaks_mlp", "torch")
    if template.git.commit is None or store._spec_text_at(template.git.commit, "specs/peaks_mlp.yaml") is None:
        pytest.skip("the commit of the committed records is not in this checkout's history")
    assert store.record_spec(template).model.layers[0].width == 20


def test_the_divergence_figure_draws_the_envelope_that_judges_every_pair(tmp_path):
    """The verdict on a curve comes from the envelope factor * e(t) + floor, so that is the
    line drawn (from the float32 records' artifacts), beside the spec's horizon rule."""
    from harness.report import figures

    steps = len(committed("peaks_mlp", "torch")[1]["losses"])
    envelope = np.geomspace(1e-6, 0.3, steps)
    for framework in ("torch", "jax", "oracle"):
        fake(tmp_path, "peaks_mlp", framework, envelope=envelope if framework != "oracle" else None)
    sources, found = store.Sources.scan(tmp_path)
    by = {r.framework: r for r in found}
    vs_oracle, between = [(by["torch"], by["oracle"]), (by["jax"], by["oracle"])], [(by["torch"], by["jax"])]
    np.testing.assert_array_equal(report.envelope_of(vs_oracle + between, sources), envelope)
    fig = figures.divergence("peaks_mlp", vs_oracle, between, sources, report.horizon_rtol(by["torch"]), report.DIFF_CLIP, envelope)
    for ax in fig.axes[:2]:
        lines = {line.get_label(): line for line in ax.get_lines()}
        drawn = next(line for label, line in lines.items() if label.startswith("tolerance: the envelope"))
        assert drawn.get_ydata().max() == pytest.approx(0.3) and drawn.get_ydata().min() < 1e-5
        assert any("loss_curve.rtol" in label for label in lines)  # peaks states a horizon rule too
    text, out = build(tmp_path)
    assert "the envelope that judges every pair" in text


def test_report_without_matplotlib_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    """In an environment without matplotlib (the README's `pip install '.[ray]'`, say), report
    says what is missing and how to get it: exit 2, no traceback."""
    import sys

    fake(tmp_path, "peaks_mlp", "torch")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.delitem(sys.modules, "harness.report.figures", raising=False)
    import harness.report

    monkeypatch.delattr(harness.report, "figures", raising=False)  # else `from harness.report import figures` finds it
    assert cli.main(["report", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pip install '.[report]'" in err and "matplotlib" in err
    assert not (tmp_path / "REPORT.md").exists()


def test_each_known_difference_is_explained_once_with_its_checks_shares_listed():
    """Issue 55: the known difference's paragraph after the table, once per entry (it was
    printed once per check, differing only in the share of what the entry explains), the
    shares of its checks listed on that one line."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from harness.core.registry import CheckVerdict
    from harness.records.store import load_records
    from harness.report.table import print_failures

    records, share = [], iter(range(1, 100))
    for record in load_records(ROOT / "results" / "mnist_adamw").values():
        checks = [
            c.model_copy(update={"diagnosis": f"known (optax-adam-float32-bias-corrections, 0.0{next(share)} of what it explains)"})
            if c.verdict == CheckVerdict.KNOWN and "bias-corrections" in (c.diagnosis or "")
            else c
            for c in record.checks
        ]
        records.append(record.model_copy(update={"checks": checks}))
    out = io.StringIO()
    print_failures(Console(file=out, width=100), [SimpleNamespace(title="mnist_adamw", records=records, member_records=[])])
    text = " ".join(out.getvalue().split())
    known = text.count("KNOWN ")
    assert known >= 3 and text.count("known difference: optax.adam evaluates") == 1, text
    listed = text.split("known (optax-adam-float32-bias-corrections, ")[-1].split(" of what it explains)")[0]
    assert len(listed.split(", ")) == text.count("bias-corrections, 0.0") - 1, listed  # every check's share, once more on the one line


def test_a_check_known_by_several_entries_is_listed_under_them_together():
    """A diagnosis naming several library entries (diagnosis.JOINED) is one explanation: its
    reason once, its checks' shares listed, and 'they explain'."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from harness.core.registry import CheckVerdict
    from harness.records.store import load_records
    from harness.report.table import KNOWN_AT, print_failures

    joint = "flax-batch-norm-fast-variance + optax-adam-float32-bias-corrections"
    assert KNOWN_AT.match(f"known ({joint}, 0.5 of what they explain)")["entry"] == joint
    records, share = [], iter(range(1, 100))
    for record in load_records(ROOT / "results" / "mnist_adamw").values():
        update = {"diagnosis": f"known ({joint}, 0.0{next(share)} of what they explain)", "reason": "known difference: both, at once"}
        checks = [c.model_copy(update=update) if c.verdict == CheckVerdict.KNOWN else c for c in record.checks]
        records.append(record.model_copy(update={"checks": checks}))
    out = io.StringIO()
    print_failures(Console(file=out, width=100), [SimpleNamespace(title="mnist_adamw", records=records, member_records=[])])
    text = " ".join(out.getvalue().split())
    assert text.count("known difference: both, at once") == 1, text
    listed = text.split(f"known ({joint}, ")[-1].split(" of what they explain)")[0]
    assert len(listed.split(", ")) == text.count("KNOWN ") >= 2, listed  # every known check's share, on the one line


def test_a_failing_comparison_counts_on_the_row_of_the_run_that_differs_from_the_reference():
    """Issue 55: with a slip on flax's side, torch's float64 row (a port's reference) read
    `ok, FAIL` and counted every failing comparison with flax's runs. A failing comparison
    counts on the row of the run that differs from the reference, on both where neither or
    both do; the FAIL lines and the exit status are unchanged."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from harness.records.store import load_records, run_label
    from harness.report.table import failed, verdict_table

    records = []
    for record in load_records(ROOT / "examples" / "results" / "mlp_port").values():
        mine = run_label(record).startswith("jax")
        checks = [c.model_copy(update={"verdict": CheckVerdict.FAIL}) if mine or c.against.startswith("jax") else c for c in record.checks]
        records.append(record.model_copy(update={"checks": checks}))
    shown = [SimpleNamespace(title="mlp_port", records=records, member_records=[])]
    out = io.StringIO()
    Console(file=out, width=200).print(verdict_table(shown))
    rows = {line.split()[0]: line for line in out.getvalue().splitlines() if "@cpu" in line}
    assert "FAIL" not in rows["torch@cpu+float64"] and "FAIL" not in rows["torch@cpu"], out.getvalue()
    assert "FAIL" in rows["jax@cpu"] and "FAIL" in rows["jax@cpu+float64"]
    assert failed(shown)
    # the float64 twin ran its first 8 steps: its loss says so, not to be read as a final one
    assert re.search(r"jax@cpu\+float64 +ok, FAIL +[0-9.]+ @8 +[0-9.]+ @8 ", rows["jax@cpu+float64"]), rows["jax@cpu+float64"]
    assert "@" not in rows["torch@cpu+float64"].split("torch@cpu+float64")[1]
