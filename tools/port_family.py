"""The generated family written as ports, at scale (docs/measurements.md, "Ports"): draws N
specs a port can take (tests/family.py, tests/port_family.py portable) with a hypothesis
seed, runs the slice [A, B) of them through model.python (torch and JAX on the CPU) and
appends one JSON line per port to OUT (its checks' counts, failing checks with their
diagnosis, known entries, seconds); ports already in OUT are skipped, so slices can run
side by side into files of their own and a stopped run goes on.

    HARNESS_DATA_DIR=... python tools/port_family.py N SEED A B OUT.jsonl [slips] [text | image] [hub]

With `slips`, each port is written again with each classic slip its layers can take
(tests/port_family.py SLIPS), one row per slip: whether a check fails, diagnosed
`implementation`, and whether its diagnosis names the module the slip is in (or the first
one after it). With `text`, the family's transformers on Debian's licences
(tests/text_ports.py), with their own slips; with `image`, the family's image networks
alone (the kind with batch norms). With `hub`, each port written in a hub's style (issue 83:
layers in lists, blocks returning tuples, flax modules taking the run's dtype, a tied weight
where shapes allow), with the hub style's own slips, each of which stops before training
with one line naming the tensor or module (`stopped`, `caught_named`).
"""

import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import port_family  # noqa: E402 (before jax: it keeps XLA's executables beside OUT)

N, SEED, a, b, out, kinds, slips, slipped, hub = port_family.tool_arguments(sys.argv[1:])
from harness.core.registry import JOINED, CheckVerdict  # noqa: E402
from tests.test_port import counted, judged  # noqa: E402

todo = port_family.to_write(out, N, SEED, a, b, slips if slipped else (None,), kinds, hub)
for i, slip, doc, path, written, row in todo:
    began = time.time()
    row["optimizer"] = doc["optimizer"]
    try:
        result = judged(path)
        row["statuses"] = {k.label: o.status for k, o in result.outcomes.items() if o.status != "ok"}
        row["reasons"] = {k.label: o.reason for k, o in result.outcomes.items() if o.status != "ok"}
        row["counts"] = counted(result.checks)
        row["failed"] = [(c.name, c.a.label, c.b.label, c.ratio, c.diagnosis[:300]) for c in result.checks if c.verdict == CheckVerdict.FAIL]
        known = [c.diagnosis.split("(")[1].split(",")[0] for c in result.checks if c.verdict == CheckVerdict.KNOWN and "(" in c.diagnosis]
        row["known"] = sorted({entry for named in known for entry in named.split(JOINED)})  # each entry of a joint explanation
        passing = [c for c in result.checks if c.verdict == CheckVerdict.PASS and c.ratio is not None]
        worst = max(passing, key=lambda c: c.ratio, default=None)
        row["worst_pass"] = worst.ratio if worst else 0
        row["worst_check"] = (worst.name, worst.a.label, worst.b.label) if worst else None
        if written is not None:
            row["named"] = written.named
            failing = [c for c in result.checks if c.verdict == CheckVerdict.FAIL]
            row["caught"] = any(c.diagnosis.startswith("implementation") for c in failing)
            row["diagnoses"] = sorted({c.diagnosis.split(":")[0] for c in failing})
            row["caught_named"] = any(any(f"{written.named}{end}" in c.diagnosis for end in " ,/") for c in failing)
    except Exception as e:  # noqa: BLE001 - a port that raises is a row saying so
        row["error"] = traceback.format_exc()[-800:]
        if written is not None and len(str(e).splitlines()) == 1:  # a slip stopped before training, in one line
            row["stopped"] = str(e)
            row["caught_named"] = f"{written.named.removeprefix('module ').replace('/', '_')}" in str(e) or written.named in str(e)
    row["s"] = round(time.time() - began, 1)
    with out.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    print(i, slip or "", row.get("counts"), len(row.get("failed", [])), row.get("caught_named", ""), row.get("error", "")[-200:], flush=True)
print("drawn", N)
