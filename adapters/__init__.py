"""Framework adapters. Each is one module exposing the same few functions:

- ``configure(precision)``: called first, before the framework is imported: "strict"
  (full float32 products, deterministic kernels) or "tf32" (TF32 allowed on the GPU).
- ``unavailable(device) -> str | None``: why it cannot run there, or None.
- ``describe(device) -> dict``: library, version, device name, math mode, threads.
- ``put(problem, device, dtype)``: the training data on the device (timed as transfer).
- ``build(problem, data, device, dtype)``: a trainer holding the initial weights and the
  optimizer state, from ``problem.initial_params`` (NumPy, stored (fan_in, fan_out)).
- ``warm_up(trainer)``: compile and warm kernels without changing the trainer's state.
- ``step(trainer, t)``: one optimizer step on step t's batch. The batch loss before the
  update is written into a loss log the trainer keeps on the device (preallocated: no
  per-step objects pile up, no host sync).
- ``synchronize(trainer)``: wait for the device.
- ``losses(trainer, upto)``, ``params(trainer)``, ``predict(trainer, x)``: results back
  as float64 NumPy arrays (the first ``upto`` logged losses).

Framework imports happen inside these functions, never at module import of harness.
"""
