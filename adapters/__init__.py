"""Framework adapters. Each is one module exposing the same few functions (typed in
adapters/protocol.py, checked for every adapter in tests/test_adapters.py):

- ``configure(precision)``: called first, before the framework is imported: "strict"
  (full float32 products, deterministic kernels) or "tf32" (TF32 allowed on the GPU).
- ``unavailable(device) -> str | None``: why it cannot run there, or None.
- ``describe(device, mode) -> dict``: library, version, device name, math mode, threads,
  and for the fast mode what it does (``fast_mode``: one line).
- ``put(problem, device, dtype)``: the training data on the device (timed as transfer).
- ``build(problem, data, device, dtype, mode)``: a trainer holding the initial weights and
  the optimizer state, from ``problem.initial_params`` (NumPy, stored (fan_in, fan_out)).
  ``mode`` is "eager" (the article-style code: one framework call per step) or "fast"
  (the framework's compiled mode: many steps per call, fused kernels, graphs).
- ``warm_up(trainer, plan)``: compile and warm kernels for every ``(start, stop)`` range
  of ``plan`` (the ranges ``train`` will be called with), without changing the state.
- ``train(trainer, start, stop)``: the optimizer steps ``start .. stop - 1``, each on its
  own batch. Each step's batch loss before the update is written into a loss log the
  trainer keeps on the device (preallocated: no per-step objects pile up, no host sync).
- ``synchronize(trainer)``: wait for the device.
- ``losses(trainer, upto)``, ``params(trainer)``, ``predict(trainer, x)``: results back
  as float64 NumPy arrays (the first ``upto`` logged losses).

Framework imports happen inside these functions, never at module import of harness.
"""
