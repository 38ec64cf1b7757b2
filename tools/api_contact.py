"""The Python API on a lent GPU (issue 51: the features that land join the contact): the README's
port example, `examples/test_port_example.py`, checked with `harness.check_port` on the
devices given, its records written (python3 tools/api_contact.py --devices cpu,gpu --results DIR).

The slip (flax's default LayerNorm epsilon) must fail as `implementation` at the norm, and
the honest port must pass, on every device, as `pytest examples/test_port_example.py` holds
them on the CPU; the slip comes first, as it fails at the initial forward pass before anything
trains. Exit 0 when both verdicts are the expected ones, 1 otherwise (each verdict printed),
2 for bad arguments. Each check's records go under DIR in a folder of its spec's name
(api_port_slip, api_port), so that the contact's archive brings them back beside the
matrix's."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "test_port_example.py"
# The lent machine runs the project from its checkout, not installed (tools/device-run.sh):
# `python3 tools/api_contact.py` puts tools/ on sys.path, not the checkout's root.
sys.path.insert(0, str(ROOT))


def example():
    """The committed example file as a module, so that its callables keep their source file
    (check_port's workers find them again by it)."""
    found = importlib.util.spec_from_file_location("port_example", EXAMPLE)
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/api_contact.py", description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu,gpu", help="as check_port's devices, comma-separated (default cpu,gpu)")
    parser.add_argument("--results", type=Path, required=True, help="a folder for the records")
    args = parser.parse_args(argv)
    import harness

    port = example()
    devices = [d for d in args.devices.split(",") if d]
    expected = []
    for name, flax_model, honest in (
        ("api_port_slip", port.flax_model_with_flax_epsilon, False),  # it fails before training
        ("api_port", port.flax_model, True),
    ):
        start = time.perf_counter()
        try:
            verdict = harness.check_port(
                port.torch_model, flax_model, port.torch_to_flax, **port.SETUP, devices=devices, name=name, results=args.results
            )
        except harness.SpecError as exc:
            print(f"tools/api_contact.py: {exc}", file=sys.stderr)
            return 2
        if honest:
            want, met = "passes", verdict.passed
        else:
            want = "fails as implementation at norm"
            met = not verdict.passed and any(f.diagnosis == "implementation" and f.module == "norm" for f in verdict.failures)
        said = "as expected" if met else "NOT as expected"
        print(f"== {name} on {','.join(devices)}: {time.perf_counter() - start:.1f} s; expected: {want}; {said}")
        print(verdict)
        expected.append(met)
    return 0 if all(expected) else 1


if __name__ == "__main__":
    sys.exit(main())
