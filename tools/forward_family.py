"""The port family's initial forward passes (docs/measurements.md, "A port's initial forward
pass"): draws N specs a port can take (tests/port_family.py) with a hypothesis seed, writes
each as a port (honest, and with each classic slip its layers can take), and appends one JSON
line per port to OUT: harness/verdict/parity.py initial_forward_check's relative difference,
its ratio to FORWARD_APART and the module it names. Nothing trains: a port takes seconds.

    HARNESS_DATA_DIR=... python tools/forward_family.py N SEED A B OUT.jsonl [text | image] [hub]

With `text`, the family's transformers on Debian's licences (tests/text_ports.py), with
their own slips; with `hub`, in a hub's style with its own slips (tools/port_family.py).
"""

import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import port_family  # noqa: E402 (before jax: it keeps XLA's executables beside OUT)

N, SEED, a, b, out, kinds, slips, _, hub = port_family.tool_arguments(sys.argv[1:])
from harness.core.registry import PORT_REFERENCE_KEY  # noqa: E402
from harness.inputs.problem import build_problem  # noqa: E402
from harness.run import port_start  # noqa: E402
from harness.spec.load import load_spec  # noqa: E402
from harness.verdict import parity  # noqa: E402

for i, slip, _, path, written, row in port_family.to_write(out, N, SEED, a, b, (None, *slips), kinds, hub):
    began = time.time()
    row["named"] = None if written is None else written.named
    try:
        loaded = load_spec(path)
        problem = build_problem(loaded)
        outputs = port_start.check_start(problem, loaded.port_sha256)
        check = parity.initial_forward_check(port_start.FLAX_TWIN_KEY, PORT_REFERENCE_KEY, outputs)
        row.update(verdict=check.verdict.value, rel=check.max_rel_error, ratio=check.ratio, module=check.forward_layer, reason=check.reason)
    except Exception:  # noqa: BLE001 - a port that raises is a row saying so
        row["error"] = traceback.format_exc()[-600:]
    row["s"] = round(time.time() - began, 1)
    with out.open("a") as f:
        f.write(json.dumps(row, default=str) + "\n")
    print(i, slip or "honest", row.get("verdict"), row.get("rel"), row.get("module"), row.get("error", "")[-200:], flush=True)
print("drawn", N)
