"""The README and the guide's pages under docs/ that it links (GUIDE_PAGES: the sections
that moved out of it) say of the committed records (results/) only what they hold: the
run, its date and commit, the host's CPU model, cores and BLAS kernels, the library and
Python versions, and the verdict table (docs/results.md), which must be what the report's
own row builder makes of that run's records. docs/findings.md's runs, commits, measured
rates and bench table are held to the records the same way. The README stays a guide of at
most README_MAX_LINES lines that links every page of the guide, and every local link of
every document leads to a file and heading that exist.

`readme_mismatches` and `findings_mismatches` list what a text gets wrong about a set of
records. The committed texts must get nothing wrong; altered texts (the host called
"AMD EPYC", other kernels, versions, run, commit, a table cell) and altered records (a
failing check, a GPU run) must each be caught.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache

import pytest

from harness.core.registry import STRICT, CheckVerdict
from harness.records.schema import Record
from harness.records.store import read, record_order, record_paths
from harness.report.rows import verdict_markdown
from tests.conftest import ROOT

RESULTS = ROOT / "results"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FINDINGS = DOCS / "findings.md"
# The pages the README's sections moved to (issue 55): the README links each of them.
GUIDE_PAGES = tuple(
    DOCS / f"{name}.md"
    for name in (
        "command-line",
        "verdict",
        "known-differences",
        "results",
        "gpu",
        "gate",
        "ports",
        "extending",
        "testing",
        "layout",
        "security",
    )
)
README_MAX_LINES = 250

# The README's sentence on the records its verdict table comes from (whitespace collapsed).
FACTS = re.compile(
    r"committed CPU records of (?P<date>\d{4}-\d{2}-\d{2}) \(run (?P<run>[0-9a-f]{12}), commit (?P<commit>[0-9a-f]{7,40}); "
    r"host `(?P<cpu>[^`]+)`, (?P<cores>\d+) cores, BLAS `(?P<blas>[^`]+)`; "
    r"torch (?P<torch>[^,;\s]+), jax (?P<jax>[^,;\s]+), NumPy (?P<numpy>[^,;\s]+), Python (?P<python>[^,;\s]+);"
)
# Words that name a CPU, and OpenBLAS kernel sets: the README may use one only as the
# records of its run have it. (Ampere is left out: the README names it as a GPU generation.)
CPU_WORDS = re.compile(r"\b(AMD|EPYC|Ryzen|Threadripper|Opteron|Intel|Xeon|Core i[3579]|Celeron|Pentium|Graviton|Apple M\d)\b")
BLAS_KERNELS = re.compile(
    r"\b(SkylakeX|Skylake|Cooperlake|SapphireRapids|Haswell|Sandybridge|Nehalem|Penryn|Prescott|Zen|Barcelona|Bulldozer|"
    r"Piledriver|Steamroller|Excavator|Neoverse\w*|ArmV8|CortexA\d+)\b"
)
RUN_ID = re.compile(r"\bruns? ([0-9a-f]{12})\b")
RUN_AND_COMMIT = re.compile(r"\brun ([0-9a-f]{12}),? \(?commit ([0-9a-f]{7,40})\b")
COMMIT = re.compile(r"\b[Cc]ommit ([0-9a-f]{7,40})\b")
RATES = re.compile(r"\brun ([0-9a-f]{12}) \(commit [0-9a-f]+[^)]*?floor from (\d+) GFLOP/s and (\d+) GB/s")
VERDICT_HEADER = "| spec | framework | device | precision |"
BENCH_HEADER = "| spec | run | framework | eager | fast | fast/eager | floor | fast / floor | fast mode's checks |"


@cache
def committed_records() -> tuple[Record, ...]:
    """Every committed record: the JSON files under results/, the schema and the figures aside."""
    paths = [p for p in record_paths(RESULTS) if p.relative_to(RESULTS).parts[0] != "figures"]
    return tuple(read(p) for p in paths)


def guide() -> str:
    """The README and the guide's pages, one text: what the README said before its sections
    moved to docs/, checked as one."""
    return "\n\n".join(page.read_text() for page in (README, *GUIDE_PAGES))


def flat(text: str) -> str:
    return " ".join(text.split())


def table_after(text: str, header: str) -> list[str]:
    """The lines of the Markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    if start is None:
        return []
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def of_run(records: Sequence[Record], run: str) -> list[Record]:
    return [r for r in records if r.run_id == run]


def one(values: set, what: str, run: str, wrong: list[str]):
    """The one value the records of a run share, else a mismatch saying they differ."""
    if len(values) != 1:
        wrong.append(f"the records of run {run} do not share one {what}: {sorted(map(str, values))}")
        return None
    return next(iter(values))


def provenance_mismatches(text: str, records: Sequence[Record]) -> list[str]:
    """Every run id the text names is a committed run; every commit it names is one the
    records were written at, and a run named with its commit was written at that commit."""
    text, wrong = flat(text), []
    runs = {r.run_id for r in records}
    commits = {r.git.commit for r in records if r.git.commit}
    for run in sorted(set(RUN_ID.findall(text)) - runs):
        wrong.append(f"run {run}: no committed record has this run id")
    for short in sorted(set(COMMIT.findall(text))):
        if not any(c.startswith(short) for c in commits):
            wrong.append(f"commit {short}: no committed record was written at this commit")
    for run, short in RUN_AND_COMMIT.findall(text):
        written_at = {(r.git.commit or "")[: len(short)] for r in of_run(records, run)}
        if written_at and written_at != {short}:
            wrong.append(f"run {run} (commit {short}): its records were written at {sorted(written_at)}")
    return wrong


def readme_mismatches(text: str, records: Sequence[Record]) -> list[str]:
    """What the README text says about the committed records that they do not hold."""
    wrong = provenance_mismatches(text, records)
    facts = FACTS.search(flat(text))
    if facts is None:
        wrong.append(f"no sentence of the form {FACTS.pattern!r}: the README does not say which records its table shows")
        # the run it should show: the newest run of the main profile
        run = max((r for r in records if r.spec.profile == "full"), key=lambda r: r.created).run_id
    else:
        run = facts["run"]
    mine = of_run(records, run)
    if not mine:
        return [*wrong, f"run {run}: no committed record has this run id"]
    # what the records of the run hold, under each name, beside the FACTS group that states it
    fields = {
        "date": ({r.created[:10] for r in mine}, "date"),
        "commit": ({(r.git.commit or "")[: len(facts["commit"]) if facts else 7] for r in mine}, "commit"),
        "host.cpu_model": ({r.host.cpu_model for r in mine}, "cpu"),
        "host.cores": ({str(r.host.cores) for r in mine}, "cores"),
        "host.blas": ({", ".join(r.host.blas) for r in mine}, "blas"),
        "host.python": ({r.host.python for r in mine}, "python"),
        "torch": ({r.libraries.get("torch") for r in mine}, "torch"),
        "jax": ({r.libraries.get("jax") for r in mine}, "jax"),
        "numpy": ({r.libraries.get("numpy") for r in mine}, "numpy"),
    }
    held = {what: one(values, what, run, wrong) for what, (values, _) in fields.items()}
    for what, (_, group) in fields.items():
        if facts is not None and held[what] is not None and held[what] != facts[group]:
            wrong.append(f"the README says {what} {facts[group]!r} for run {run}; its records say {held[what]!r}")
    for word in sorted(set(CPU_WORDS.findall(text))):
        if held["host.cpu_model"] is not None and word not in held["host.cpu_model"]:
            wrong.append(f"the README names the CPU {word!r}; the records of run {run} say {held['host.cpu_model']!r}")
    for kernel in sorted(set(BLAS_KERNELS.findall(text))):
        if held["host.blas"] is not None and kernel not in held["host.blas"]:
            wrong.append(f"the README names the BLAS kernels {kernel!r}; the records of run {run} say {held['host.blas']!r}")

    table = table_after(text, VERDICT_HEADER)
    expected = verdict_markdown(sorted((r for r in mine if r.precision_mode == STRICT), key=record_order)).splitlines()
    if table != expected:
        wrong.append("the README's verdict table is not the report's for run " + run + "; it should read:\n" + "\n".join(expected))

    said = flat(text)
    checks = [(r, c) for r in mine for c in r.checks]
    if "Every check passes" in said and (any(c.verdict == CheckVerdict.FAIL for _, c in checks) or any(r.status != "ok" for r in mine)):
        wrong.append(f"the README says every check passes; run {run} has a failing check or run")
    known = [(r, c) for r, c in checks if c.verdict == CheckVerdict.KNOWN]
    if "`known` checks on peaks are JAX's step-1 parameters" in said and not all(
        r.spec.name == "peaks_mlp" and c.name == "params_after_step_1" and "jax" in (r.framework + c.against) for r, c in known
    ):
        wrong.append(f"the README says the known checks are JAX's step-1 parameters on peaks; run {run} has others")
    if "No GPU records yet" in said and any(r.device.kind == "gpu" for r in records):
        wrong.append("the README says there are no GPU records; results/ holds some")
    if "MNIST on the offline test-set files" in said and {r.data.source for r in mine if r.spec.name == "mnist_mlp"} != {"test-set"}:
        wrong.append(f"the README says MNIST ran on the test-set files; the records of run {run} say otherwise")
    return wrong


def close_as_shown(shown: str, actual: float) -> bool:
    """Whether `actual` rounds to `shown` (e.g. "0.98x", "6.50", "52.0"), half a unit of its last digit either way."""
    number = shown.rstrip("x").replace(",", "")
    decimals = len(number.split(".")[1]) if "." in number else 0
    return abs(float(number) - actual) <= 0.5 * 10**-decimals * (1 + 1e-9)


def findings_mismatches(text: str, records: Sequence[Record]) -> list[str]:
    """What docs/findings.md says about the committed records that they do not hold: its
    runs and commits, the rates a bench run's floor came from, and its bench table."""
    wrong = provenance_mismatches(text, records)
    for run, gflops, gbs in RATES.findall(flat(text)):
        floors = {(round(r.floor.matmul_flops_per_s / 1e9), round(r.floor.bandwidth_bytes_per_s / 1e9)) for r in of_run(records, run) if r.floor}
        if floors != {(int(gflops), int(gbs))}:
            wrong.append(f"run {run}: floor from {gflops} GFLOP/s and {gbs} GB/s; its records' floors come from {sorted(floors)}")
    table = table_after(text, BENCH_HEADER)
    if not table:
        wrong.append(f"no bench table ({BENCH_HEADER})")
    spec = ""
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        spec = cells[0].split()[0] if cells[0] else spec
        run, framework, eager_ms, fast_ms, speedup, floor_ms, fast_over_floor, fast_checks = cells[1:]
        pair = {
            r.mode: r
            for r in of_run(records, run)
            if r.spec.name == spec and r.framework == framework and r.precision_mode == STRICT and r.device.kind == "cpu"
        }
        if set(pair) != {"eager", "fast"}:
            wrong.append(f"{line}: run {run} has no eager and fast records of {spec} {framework}")
            continue
        eager, fast = pair["eager"], pair["fast"]
        measured = {
            "eager": (eager_ms, eager.timings.per_step_s * 1e3),
            "fast": (fast_ms, fast.timings.per_step_s * 1e3),
            "fast/eager": (speedup, eager.timings.per_step_s / fast.timings.per_step_s),
            "floor": (floor_ms, fast.floor.floor_s * 1e3),
            "fast / floor": (fast_over_floor, fast.floor.measured_over_floor),
        }
        for what, (shown, actual) in measured.items():
            if not close_as_shown(shown, actual):
                wrong.append(f"{spec} {framework} (run {run}): {what} {shown}; the records say {actual:.4g}")
        known_said = re.match(r"ok(?: \((\d+) known)?", fast_checks)
        verdicts = [c.verdict for c in fast.checks]
        if known_said is None or CheckVerdict.FAIL in verdicts or verdicts.count(CheckVerdict.KNOWN) != int(known_said[1] or 0):
            wrong.append(
                f"{spec} {framework} (run {run}): fast mode's checks {fast_checks!r}; the records hold {verdicts.count(CheckVerdict.KNOWN)} known"
            )
    said = flat(text)
    host = re.search(r"the older committed records name no kernels, and their `host.cpu_model` is `([^`]+)`", said)
    if host:
        # the runs the sentence before names (the committed CPU records ...), else the newest
        named = re.search(r"the committed CPU records \(runs? ([0-9a-f]{12}(?:(?:, | and )[0-9a-f]{12})*)\) name", said)
        newest = set(re.findall(r"[0-9a-f]{12}", named[1])) if named else {max(records, key=lambda r: r.created).run_id}
        # the records written before those runs (a later GPU host's run is no older record)
        since = min((r.created for r in records if r.run_id in newest), default="")
        older = [r for r in records if r.run_id not in newest and r.created < since]
        if any(r.host.blas for r in older) or {r.host.cpu_model for r in older} != {host[1]}:
            wrong.append(f"the older records' hosts: {sorted({(r.host.cpu_model, tuple(r.host.blas)) for r in older})}")
    return wrong


def test_the_readme_says_of_the_committed_records_only_what_they_hold():
    assert readme_mismatches(guide(), committed_records()) == []


def test_the_verdict_table_and_the_sentence_on_its_records_are_on_the_results_page():
    results = (DOCS / "results.md").read_text()
    assert FACTS.search(flat(results)) and table_after(results, VERDICT_HEADER)


def test_the_readme_is_a_short_guide_that_links_every_page_of_the_guide():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines, more than {README_MAX_LINES}"
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in LINK.findall(text) if not re.match(r"[a-z]+:", target)}
    for page in GUIDE_PAGES:
        assert page.is_file(), f"{page.relative_to(ROOT)}: no such page"
        assert page.resolve() in linked, f"README.md does not link {page.relative_to(ROOT)}"


def test_docs_findings_says_of_the_committed_records_only_what_they_hold():
    assert findings_mismatches(FINDINGS.read_text(), committed_records()) == []


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_every_local_link_leads_to_a_file_and_heading_that_exist(doc):
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        assert file.exists(), f"{doc.name}: {target}: no such file"
        if anchor:
            headings = [slug(line.lstrip("#")) for line in file.read_text().splitlines() if line.startswith("#")]
            assert anchor in headings, f"{doc.name}: {target}: no such heading in {file.name}"


def altered(text: str, old: str, new: str) -> str:
    """text with the first `old` (any whitespace between its words) replaced by `new`."""
    pattern = r"\s+".join(map(re.escape, old.split()))
    changed, n = re.subn(pattern, lambda _: new, text, count=1)
    assert n == 1, f"{old!r} is not in the text"
    return changed


@pytest.mark.parametrize(
    ("old", "new", "caught"),
    [
        ("host `Intel(R) Xeon(R) Processor`, 2 cores", "2-core AMD EPYC VM", "AMD"),  # what the README said before
        ("host `Intel(R) Xeon(R) Processor`", "host `AMD EPYC`", "host.cpu_model"),
        ("2 cores", "4 cores", "host.cores"),
        ("0.3.31.188.0 SkylakeX", "0.3.31.188.0 Haswell", "host.blas"),
        ("torch 2.13.0+cpu", "torch 2.12.0+cpu", "torch"),
        ("jax 0.10.2, NumPy", "jax 0.10.1, NumPy", "jax"),
        ("Python 3.11.7", "Python 3.12.1", "host.python"),
        ("records of 2026-11-24 (run", "records of 2026-11-22 (run", "date"),
        ("(run f6d668528020, commit", "(run f6d668528021, commit", "f6d668528021"),
        ("commit 8cfc6ba;", "commit 8cfc6bb;", "8cfc6bb"),
        ("630/630 (max rel 3.6e-07)", "630/630 (max rel 3.6e-08)", "verdict table"),
        ("The session reads", "On OpenBLAS's Zen kernels the session reads", "Zen"),
    ],
)
def test_the_readme_check_catches_a_wrong_fact(old, new, caught):
    wrong = readme_mismatches(altered(guide(), old, new), committed_records())
    assert any(caught in line for line in wrong), wrong


def test_the_readme_check_rejects_the_old_sentence_on_an_amd_epyc_vm():
    old = "(run f6d668528020, commit 8cfc6ba; 2-core AMD EPYC VM, torch 2.13.0, jax 0.10.2; MNIST on the offline test-set files;"
    text = re.sub(r"\(run f6d668528020, commit.*?test-set files;", old, flat(guide()), count=1)
    assert old in text
    wrong = readme_mismatches(text, committed_records())
    assert any("AMD" in line for line in wrong) and any("no sentence of the form" in line for line in wrong), wrong


def test_the_readme_check_reads_the_records_too():
    """The same README is wrong about records that fail a check, or that hold a GPU run."""
    records = list(committed_records())
    i = next(i for i, r in enumerate(records) if r.run_id == "f6d668528020" and r.checks)
    failing = records[i].checks[0].model_copy(update={"verdict": CheckVerdict.FAIL.value})
    with_a_failure = [*records[:i], records[i].model_copy(update={"checks": [failing, *records[i].checks[1:]]}), *records[i + 1 :]]
    assert any("every check passes" in line for line in readme_mismatches(guide(), with_a_failure))
    said = guide() + "\nNo GPU records yet.\n"  # what it said before the first GPU run
    cpu_only = [r for r in records if r.device.kind == "cpu"]
    assert not any("no GPU records" in line for line in readme_mismatches(said, cpu_only))
    gpu = cpu_only[0].model_copy(update={"device": cpu_only[0].device.model_copy(update={"kind": "gpu"})})
    assert any("no GPU records" in line for line in readme_mismatches(said, [*cpu_only, gpu]))


@pytest.mark.parametrize(
    ("old", "new", "caught"),
    [
        ("floor from 187 GFLOP/s and 43 GB/s", "floor from 155 GFLOP/s and 31 GB/s", "floor from 155"),  # what it said before
        ("| cc5eaae79b21 | jax | 2.87 | 2.18 |", "| cc5eaae79b21 | jax | 2.87 | 2.08 |", "fast 2.08"),
        (
            "| b2f3a19afd9e | torch | 37.7 | 33.2 | 1.14x | 0.638 | 52.0 | ok (6 known",
            "| b2f3a19afd9e | torch | 37.7 | 33.2 | 1.14x | 0.638 | 52.0 | ok (5 known",
            "5 known",
        ),
        ("Peaks is run cc5eaae79b21 (commit 05fafcc", "Peaks is run cc5eaae79b21 (commit ffda6cc", "cc5eaae79b21 (commit ffda6cc)"),
        ("`host.cpu_model` is `AMD EPYC`", "`host.cpu_model` is `Intel(R) Xeon(R) Processor`", "older records"),
    ],
)
def test_the_findings_check_catches_a_wrong_figure(old, new, caught):
    wrong = findings_mismatches(altered(FINDINGS.read_text(), old, new), committed_records())
    assert any(caught in line for line in wrong), wrong
