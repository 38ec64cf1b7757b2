"""The port family's initial forward passes (docs/measurements.md, "A port's initial forward
pass"): draws N specs a port can take (tests/port_family.py) with a hypothesis seed, writes
each as a port (honest, and with each classic slip its layers can take), and appends one JSON
line per port to OUT: harness/verdict/parity.py initial_forward_check's relative difference,
its ratio to FORWARD_APART and the module it names. Nothing trains: a port takes seconds.

    HARNESS_DATA_DIR=... python tools/forward_family.py N SEED A B OUT.jsonl [text]

With `text`, the family's transformers on Debian's licences (tests/text_ports.py), with
their own slips.
"""

import json
import os
import sys
import time
import traceback
from pathlib import Path

N, SEED, a, b, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
# XLA's executables kept on disk beside OUT: the ports' runs compile the same programs again
# and again (2026-11-28: a text port's 25.6 s of compiling, 2.0 s with them kept); the same
# program gives the same executable, so no bit changes
kept = {
    "JAX_COMPILATION_CACHE_DIR": str(out.with_suffix(".jax-cache")),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
for name, value in kept.items():
    os.environ.setdefault(name, value)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.core.registry import PORT_REFERENCE_KEY  # noqa: E402
from harness.inputs.problem import build_problem  # noqa: E402
from harness.run import port_start  # noqa: E402
from harness.spec.load import load_spec  # noqa: E402
from harness.verdict import parity  # noqa: E402
from tests import port_family, text_ports  # noqa: E402

kinds, slips = (("text",), text_ports.TEXT_SLIPS) if "text" in sys.argv[6:] else (None, port_family.SLIPS)
for i, slip, _, path, written, row in port_family.to_write(out, N, SEED, a, b, (None, *slips), kinds):
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
