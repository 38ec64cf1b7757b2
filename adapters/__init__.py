"""Framework adapters. Each is one module exposing the same few functions (typed in
adapters/protocol.py, checked for every adapter in tests/test_adapters.py). Each function
that sets a run up takes its `RunKey` (harness/core/registry.py): device, dtype, precision
("strict": full float32 products, deterministic kernels; "tf32": TF32 allowed on the GPU;
"float64": the float64 twin) and mode.

- ``unavailable(key) -> str | None``: why it cannot run there, or None.
- ``describe(key) -> dict``: library, version, device name, math mode, threads, and for
  the fast mode what it does (``fast_mode``: one line).
- ``put(problem, key)``: the training data on the device (timed as transfer); what to put
  is ``problem.host_arrays``.
- ``build(problem, data, key)``: a trainer holding the initial weights and the optimizer
  state, from ``problem.initial_params`` (NumPy, stored (fan_in, fan_out)), with the
  key's precision applied. ``key.mode`` is "eager" (the article-style code: one framework
  call per step) or "fast" (the framework's compiled mode: many steps per call, fused
  kernels, graphs).
- ``warm_up(trainer, plan)``: compile and warm kernels for every ``(start, stop)`` range
  of ``plan`` (the ranges ``train`` will be called with), without changing the state.
- ``train(trainer, start, stop)``: the optimizer steps ``start .. stop - 1``, each on its
  own batch. Each step's batch loss before the update is written into a loss log the
  trainer keeps on the device (preallocated: no per-step objects pile up, no host sync).
- ``synchronize(trainer)``: wait for the device.
- ``state(trainer, upto)``: the first ``upto`` logged losses and the parameters, and
  ``predict(trainer, x)``: the outputs, back as NumPy arrays.
- optional ``rates(device, precision)``: the device's measured rates, for the floor.

Framework imports happen inside these functions, never at module import of harness.
"""
