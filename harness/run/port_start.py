"""A port before any run (issue 52), in a fresh process (harness/matrix.py check_port_start):
JAX's thread pool never starts in the driver.

- The converter (adapters/jax_port_check.py): the user's torch_to_flax of the port's initial
  tensors against flax's own init of the user's module, leaf by leaf.
- The initial forward pass: torch's and flax's float64 outputs of step 0's batch, each
  module's, as the float64 runs record them, for harness/verdict/parity.py
  initial_forward_check to judge before anything trains."""

from __future__ import annotations

import numpy as np

from adapters import jax_port_check
from harness.core.registry import FLOAT64, PORT_REFERENCE_KEY, RunKey
from harness.inputs import port
from harness.inputs.problem import Problem
from harness.run import runner

FLAX_TWIN_KEY = RunKey("jax", "cpu", precision=FLOAT64)  # flax's float64 run, judged against PORT_REFERENCE_KEY


def check_start(problem: Problem, loaded_sha256: str) -> dict[str, dict[str, np.ndarray]]:
    """Before any run: the converter (jax_port_check.check_converter), then both initial forward passes
    (initial_forward)."""
    model = problem.spec.model
    tokens = model.tokens is not None
    jax_port_check.check_converter(problem.port, loaded_sha256, model.functions, problem.initial_params, model.in_shape, tokens, problem.port_tied)
    return initial_forward(problem)


def initial_forward(problem: Problem) -> dict[str, dict[str, np.ndarray]]:
    """torch's and flax's float64 forward passes of step 0's batch in training mode, from the
    port's initial tensors, as their float64 runs record them (runner.first_batch_layers):
    each module's output by module path, the whole module's as `output`; by run label."""
    found = {}
    for key in (PORT_REFERENCE_KEY, FLAX_TWIN_KEY):
        adapter, reason = runner.prepared_adapter(key)
        if reason:
            raise port.PortError(f"{problem.port}: {key.label} cannot run: {reason}")
        trainer = adapter.build(problem, adapter.put(problem, key), key)
        found[key.label] = runner.first_batch_layers(adapter, trainer, problem)
    return found
