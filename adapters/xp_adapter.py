"""The array-module adapter: the network of harness.reference.network, bound to NumPy on the
CPU (the framework `numpy`) and to CuPy on the GPU (`cupy`). In float64 on NumPy it is the
reference oracle. Its fast mode (adapters/xp_fast.py) is written for dense networks."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapters import timing, xp_fast
from adapters.protocol import State
from harness.core.errors import Unsupported
from harness.core.registry import BF16, ORACLE, TF32
from harness.optimizers import adam
from harness.reference import autocast, network

NAME = "xp"


def _xp(key):
    return np if key.device == "cpu" else _cupy(key.precision)


def _cupy(precision: str):
    """cupy, with TF32 allowed or not: CuPy reads CUPY_TF32 when it creates its cuBLAS
    handle, so it is set before the first product (each run has a process of its own)."""
    os.environ["CUPY_TF32"] = "1" if precision == TF32 else "0"
    import cupy

    return cupy


def unavailable(key) -> str | None:
    if key.device == "cpu":
        return None
    try:
        cupy = _xp(key)
    except ImportError as exc:
        return f"cupy is not installed ({exc})"
    try:
        if not cupy.is_available():
            return "cupy finds no usable CUDA device"
    except Exception as exc:  # a broken driver or runtime raises here, not a clean False
        return f"cupy cannot use the GPU: {exc}"
    return None


def describe(key) -> dict[str, Any]:
    info = _describe(key.device)
    if key.mode == "fast":
        info["fast_mode"] = xp_fast.describe(key.device)
    elif key.framework == ORACLE or key.variant:
        info["plain_steps"] = "allocation-free where the network allows it (plain_steps_fast: bitwise the eager steps)"
    return info


def _blas_threads() -> int | None:
    """The threads of NumPy's BLAS (a cap, harness/execute/executors.py, lowers them)."""
    from threadpoolctl import threadpool_info

    found = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas" and "numpy" in lib.get("filepath", "")]
    return found[0] if found else os.cpu_count()


def _describe(device: str) -> dict[str, Any]:
    if device == "cpu":
        return {
            "library": "numpy",
            "version": np.__version__,
            "device_name": platform.processor() or platform.machine(),
            "math_mode": {"float32_matmul": "exact float32 (BLAS sgemm)"},
            "threads": _blas_threads(),
        }
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return {
        "library": "cupy",
        "version": cupy.__version__,
        "device_name": props["name"].decode(),
        "math_mode": {
            "CUPY_TF32": os.environ.get("CUPY_TF32", "0 (default: TF32 off)"),
            "reductions": "CuPy's own kernels (no atomics: the same order every run)",
        },
        "threads": None,
    }


@dataclass
class Trainer:
    problem: Any
    device: str
    dtype: str
    xp: Any
    data: dict[str, Any]
    params: dict  # name -> array, in the spec's layout (network.Params)
    loss_log: Any = None
    opt_state: dict | None = None
    placed: list = field(default_factory=list)
    fast: Any = None  # the fast mode's preallocated step (adapters.xp_fast.FastMLP), or None
    jitter: Any = network.plain  # a calibration member's extra rounding (network.jitter_function)
    reorder: Any = None  # a calibration member's other summation orders (network.Context.reorder)
    # The harness's own runs (the oracle, the calibration members, the references) train
    # their plain steps on the allocation-free path, bitwise the eager steps (plain_steps_fast)
    allocation_free: bool = False
    low: Any = None  # a bf16 run's rounding to bfloat16 (harness/reference/autocast.py), None otherwise


def put(problem, key) -> dict[str, Any]:
    xp = _xp(key)
    return {k: xp.asarray(v) for k, v in problem.host_arrays(key.dtype).items()}


def build(problem, data: dict[str, Any], key) -> Trainer:
    xp, device, dtype, mode = _xp(key), key.device, key.dtype, key.mode
    params = {name: xp.asarray(a.astype(dtype)) for name, a in problem.initial_params.items()}
    trainer = Trainer(problem, device, dtype, xp, data, params, xp.zeros(problem.total_steps, dtype=dtype))
    trainer.placed = problem.spec.model.placed
    if problem.jitter_seed is not None:
        if mode == "fast":
            raise ValueError("a calibration member (jittered rounding) runs in eager mode only")
        trainer.jitter = network.jitter_function(xp, problem.jitter_seed)
        trainer.reorder = np.random.default_rng([problem.jitter_seed, 1])
    if key.precision == BF16:
        if mode == "fast":
            raise Unsupported("the array-module code's bf16 run is eager only")
        trainer.low = autocast.rounding(xp)
    if mode == "fast":  # trains the arrays of trainer.params in place; it keeps the optimizer state
        if not problem.spec.model.is_mlp:
            raise Unsupported(f"the array-module fast mode trains dense networks only; {problem.spec.name} has other layers (run it eager)")
        if not problem.spec.plain_training:
            raise Unsupported(f"the array-module fast mode takes plain SGD and Adam only; {problem.spec.name} has a training recipe (run it eager)")
        layers = [(params[f"{p.name}.weight"], params[f"{p.name}.bias"]) for p in trainer.placed]
        trainer.fast = xp_fast.FastMLP(xp, problem, data, layers, dtype, trainer.loss_log)
    else:
        trainer.opt_state = network.optimizer_init(xp, problem.spec.optimizer, params, network.trained_names(trainer.placed))
        trainer.allocation_free = plain_steps_fast(problem, key)
    return trainer


def plain_steps_fast(problem, key) -> bool:
    """Whether a run trains its plain steps (those a member does not round otherwise) on the
    allocation-free path: the harness's own runs on NumPy (the oracle's, and every variant:
    the calibration members, the first steps' reference, the library references), where the
    fast mode takes the network (dense, plain SGD or Adam, Adam's bias corrections as
    Python floats or as optax's float32 ones). Bitwise the eager steps
    (tests/test_fast_xp.py); the article-style eager runs a framework is timed by stay eager."""
    own = key.framework == ORACLE or bool(key.variant)
    return (
        own
        and key.device == "cpu"
        and problem.spec.model.is_mlp
        and problem.spec.plain_training
        and not (problem.clip_eps or problem.rates is not None or problem.sequential_loss)
    )


def _go_fast(trainer: Trainer) -> None:
    """Hand the trainer's state to the allocation-free step: it trains the same arrays in
    place, and Adam's moments (the eager state's arrays, kept by name for training_state)."""
    layers = [(trainer.params[f"{p.name}.weight"], trainer.params[f"{p.name}.bias"]) for p in trainer.placed]
    fast = xp_fast.FastMLP(trainer.xp, trainer.problem, trainer.data, layers, trainer.dtype, trainer.loss_log)
    if fast.adam:
        m, v = trainer.opt_state["m"], trainer.opt_state["v"]
        fast.m = [(m[f"{p.name}.weight"], m[f"{p.name}.bias"]) for p in trainer.placed]
        fast.v = [(v[f"{p.name}.weight"], v[f"{p.name}.bias"]) for p in trainer.placed]
    trainer.fast = fast


def warm_up(trainer: Trainer, plan=()) -> None:
    """Nothing to compile; on the GPU, one throwaway step loads the kernels, but for a
    calibration member's (nothing times it, and its step would draw from the seeded
    roundings its steps take: a member on the GPU rounds as the same member on the CPU).
    The fast mode compiles its kernels and captures its graphs (on the GPU), then restores
    the state."""
    if trainer.fast is not None:
        trainer.fast.warm_up(plan)
    elif trainer.device != "cpu" and trainer.problem.jitter_seed is None:
        _update(trainer, trainer.params, trainer.opt_state, 0)


def _update(trainer: Trainer, params, opt_state, step: int):
    problem = trainer.problem
    x, y = problem.batch(trainer.data, step)
    member = problem.jittered(step)
    jitter = trainer.jitter if member else network.plain
    masks = problem.step_masks(trainer.data, step)
    ctx = network.Context(
        jitter=jitter,
        masks=masks,
        reorder=trainer.reorder if member else None,
        sequential_loss=problem.sequential_loss,
        autodiff_loss=problem.jitter_seed is not None,
        autocast=_autocast(trainer),
    )
    corrections = adam.float32_bias_corrections if problem.float32_corrections else None
    return network.train_step(
        trainer.xp, trainer.placed, params, opt_state, x, y, problem.spec, len(problem.x_train), ctx, problem.clip_eps, problem.rates, corrections
    )


def train(trainer: Trainer, start: int, stop: int) -> None:
    problem = trainer.problem
    if trainer.fast is None and trainer.allocation_free and start >= problem.jitter_from + problem.jitter_steps:
        _go_fast(trainer)
    if trainer.fast is not None:
        trainer.fast.train(start, stop)
        return
    for t in range(start, stop):
        trainer.loss_log[t], trainer.params, trainer.opt_state = _update(trainer, trainer.params, trainer.opt_state, t)


def synchronize(trainer: Trainer) -> None:
    if trainer.fast is not None:
        trainer.fast.synchronize()
    if trainer.device != "cpu":
        trainer.xp.cuda.get_current_stream().synchronize()


def state(trainer: Trainer, upto: int) -> State:
    losses = np.asarray(_to_numpy(trainer, trainer.loss_log[:upto]), dtype=np.float64)
    return State(losses, {name: np.array(_to_numpy(trainer, a)) for name, a in trainer.params.items()})


def _to_numpy(trainer: Trainer, a):
    return a if trainer.device == "cpu" else trainer.xp.asnumpy(a)


def load_state(trainer: Trainer, state: dict[str, np.ndarray], step: int) -> None:
    """Go on from a training state after `step` updates (the whole state by name:
    harness.reference.network.training_state): the tensors and the optimizer's moments and
    update count, as the oracle keeps them."""
    if trainer.fast is not None:
        raise ValueError("the array-module fast mode starts from the initial state only (run it eager)")
    xp, dtype = trainer.xp, trainer.dtype
    params, moments = network.split_training_state({name: xp.asarray(np.asarray(a).astype(dtype)) for name, a in state.items()})
    trainer.params = {name: params[name] for name in trainer.params}
    trainer.opt_state = network.optimizer_state(trainer.problem.spec.optimizer, step, moments)


def training_state(trainer: Trainer) -> dict[str, np.ndarray]:
    """The whole training state by name, on the host (the inverse of load_state)."""
    host = {name: np.array(_to_numpy(trainer, a)) for name, a in trainer.params.items()}
    opt_state = {field: {n: np.array(_to_numpy(trainer, a)) for n, a in trainer.opt_state.get(field, {}).items()} for field in ("m", "v", "buf")}
    return network.training_state(host, opt_state)


# The examples a NumPy float64 evaluation without a member's roundings (the oracle's) takes
# at once. The whole set in one pass made a LeNet's first windows one 1.25 GB array on
# 8,000 images (9.4 GB on 60,000) and took 2.7x the time of blocks of 512. The blocks'
# outputs are one pass's to a few roundings: dgemm rounds a few rows of some counts
# otherwise (1 ulp in 7 rows of 1,529), and on the committed specs' sets they are its
# bits (docs/measurements.md, 2026-12-02). Float32 stays one pass (sgemm's bits move with
# the rows it multiplies: 3e-8 on mnist_mlp), and so does a member (its roundings are
# drawn in one pass's order).
EVAL_BLOCK = 512


def predict(trainer: Trainer, x: np.ndarray) -> np.ndarray:
    xp = trainer.xp

    def forward(part: np.ndarray):
        return network.predict(xp, trainer.placed, trainer.params, xp.asarray(part.astype(trainer.dtype)), trainer.jitter, _autocast(trainer))

    if xp is np and trainer.dtype == "float64" and trainer.jitter is network.plain and len(x) > EVAL_BLOCK:
        outputs = np.concatenate([forward(x[i : i + EVAL_BLOCK]) for i in range(0, len(x), EVAL_BLOCK)])
    else:
        outputs = forward(x)
    return np.asarray(_to_numpy(trainer, outputs), dtype=np.float64)


def layer_outputs(trainer: Trainer, x: np.ndarray, masks: dict) -> dict[str, np.ndarray]:
    """Each layer's output of a training-mode forward pass of x (dropout masks given),
    state untouched: where a twin's forward first differs (the diagnosis)."""
    xp, found = trainer.xp, {}
    masks = {name: xp.asarray(m.astype(trainer.dtype)) for name, m in masks.items()}
    ctx = network.Context(train=True, masks=masks, autocast=_autocast(trainer))
    network.forward(xp, trainer.placed, trainer.params, xp.asarray(x.astype(trainer.dtype)), ctx, outputs=found)
    return {name: np.asarray(_to_numpy(trainer, a), dtype=np.float64) for name, a in found.items()}


def _autocast(trainer: Trainer):
    """A fresh pass's bf16 rounding for a bf16 run, None for any other."""
    return None if trainer.low is None else autocast.Autocast(trainer.low)


def computed_in(trainer: Trainer) -> dict[str, str]:
    """Where a bf16 run computes in bfloat16 (adapters/protocol.py RecordsComputedIn): each
    layer's output dtype on step 0's batch and the loss's, its parameters and optimizer
    state float32 (harness/reference/autocast.py)."""
    problem, cast = trainer.problem, _autocast(trainer)
    x, _ = problem.batch(trainer.data, 0)
    ctx = network.Context(train=True, masks=problem.step_masks(trainer.data, 0), autocast=cast)
    network.forward(trainer.xp, trainer.placed, trainer.params, x, ctx)
    return {**cast.computed_in(), "parameters": trainer.dtype, "optimizer state": trainer.dtype}


def rates(device: str, precision: str) -> dict[str, float]:
    """NumPy's rates on the CPU, CuPy's on the GPU (with a CUDA graph's per-kernel cost)."""
    if device == "cpu":
        return _numpy_rates()
    cupy = _cupy(precision)
    if not cupy.is_available():
        raise RuntimeError("no CUDA device")
    return _cupy_rates(cupy)


def _numpy_rates() -> dict[str, float]:
    n = timing.CPU_MATMUL_N
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    out = np.empty_like(a)
    matmul = 2 * n**3 / timing.best_seconds(lambda: np.matmul(a, a, out=out))
    src = np.ones(timing.CPU_COPY_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    copy = 2 * src.nbytes / timing.best_seconds(lambda: np.copyto(dst, src))
    return {"matmul": matmul, "bandwidth": copy}


def _cupy_rates(cupy) -> dict[str, float]:
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        sync = stream.synchronize
        n = timing.GPU_MATMUL_N
        a = cupy.random.random((n, n), dtype=cupy.float32)
        out = cupy.empty_like(a)
        matmul = 2 * n**3 / timing.best_seconds(lambda: cupy.matmul(a, a, out=out), sync)
        src = cupy.ones(timing.GPU_COPY_BYTES // 4, dtype=cupy.float32)
        dst = cupy.empty_like(src)
        copy = 2 * src.nbytes / timing.best_seconds(lambda: cupy.copyto(dst, src), sync)
        x = cupy.zeros(1, dtype=cupy.float32)
        x += 1  # compile the kernel before capture
        stream.synchronize()
        stream.begin_capture()
        for _ in range(timing.GRAPH_KERNELS):
            x += 1
        graph = stream.end_capture()
        launch = timing.best_seconds(lambda: graph.launch(stream), sync) / timing.GRAPH_KERNELS
    return {"matmul": matmul, "bandwidth": copy, "launch": launch}
