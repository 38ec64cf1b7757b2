"""Each adapter against the float64 oracle after one step, with the spec's own tolerances;
and the protocol's promises (warm-up changes nothing, unavailable is a reason)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import numpy as np
import pytest

from harness.core import registry
from tests.conftest import CPU_FRAMEWORKS, GPU_FRAMEWORKS, UNIT_TOLERANCES, first_loss, key_for, one_step, quick_problem, trainer_of

SPECS = ["peaks_mlp", "moons_net", "mnist_mlp"]


def adapter_or_skip(name: str, device: str = "cpu"):
    module = registry.load(name)
    reason = module.unavailable(key_for(module, device))
    if reason:
        pytest.skip(reason)
    return module


@pytest.mark.parametrize("spec_name", SPECS)
@pytest.mark.parametrize("framework", CPU_FRAMEWORKS)
def test_adapter_matches_oracle_after_one_step(framework, spec_name, oracle_step):
    adapter = adapter_or_skip(framework)
    problem, (ref_out, ref_loss, ref_params) = oracle_step(spec_name)
    outputs, loss, params = one_step(adapter, problem, "float32")
    checks = UNIT_TOLERANCES
    tol = checks.initial_outputs
    np.testing.assert_allclose(outputs, ref_out, rtol=tol.rtol, atol=tol.atol)
    assert loss == pytest.approx(ref_loss, rel=checks.initial_loss.rtol)
    tol = checks.params_after_first_step
    assert list(params) == list(ref_params)
    for tensor, ref in ref_params.items():
        assert params[tensor].shape == ref.shape, tensor
        np.testing.assert_allclose(params[tensor], ref, rtol=tol.rtol, atol=tol.atol, err_msg=tensor)
    moved = any(not np.array_equal(params[tensor], w0) for tensor, w0 in problem.initial_params.items() if tensor.endswith(".weight"))
    assert moved, "one step left every weight where it was"


@pytest.mark.parametrize("framework", CPU_FRAMEWORKS)
def test_warm_up_leaves_the_state_alone(framework):
    adapter = adapter_or_skip(framework)
    problem = quick_problem("peaks_mlp")
    trainer = trainer_of(adapter, problem, "cpu", "float32")
    before = adapter.state(trainer, 0).params
    adapter.warm_up(trainer)
    adapter.synchronize(trainer)
    after = adapter.state(trainer, 0).params
    assert list(after) == list(before)
    for tensor, a0 in before.items():
        assert np.array_equal(after[tensor], a0), tensor
    first = first_loss(adapter, trainer)
    again = trainer_of(adapter, problem, "cpu", "float32")
    assert first_loss(adapter, again) == first


def test_jax_compiles_nothing_inside_the_timed_loop():
    """After warm_up the jitted step's cache is complete: the first steps' outputs (committed
    device arrays) hit it. optax's uncommitted step count once made step 2 compile again,
    0.36 s counted as training."""
    adapter = adapter_or_skip("jax")
    for name in ("peaks_mlp", "moons_net"):
        problem = quick_problem(name)
        trainer = trainer_of(adapter, problem, "cpu", "float32")
        adapter.warm_up(trainer)
        compiled = trainer.train_step._cache_size()
        for t in range(3):
            adapter.train(trainer, t, t + 1)
        adapter.synchronize(trainer)
        assert trainer.train_step._cache_size() == compiled


# What each adapter's describe(key)["math_mode"] must say on the CPU, per precision: the
# flags its build sets for that key, read back from the framework.
TORCH_MODE = {
    "strict": {"float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False},
    "tf32": {"float32_matmul_precision": "high", "cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": True},
    "float64": {"float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False},
    "bf16": {"float32_matmul_precision": "highest", "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False, "autocast": "bfloat16"},
}
JAX_MODE = {
    "strict": {"jax_default_matmul_precision": "highest", "jax_enable_x64": False},
    "tf32": {"jax_default_matmul_precision": "tensorfloat32", "jax_enable_x64": False},
    "float64": {"jax_default_matmul_precision": "highest", "jax_enable_x64": True},
    "bf16": {"jax_default_matmul_precision": "highest", "jax_enable_x64": False, "flax_dtype": "bfloat16"},
}
NUMPY_MODE = {"float32_matmul": "exact float32 (BLAS sgemm)"}  # NumPy has one math mode, whatever the key
DETERMINISTIC_CUBLAS = (":4096:8", ":16:8")  # the workspace settings torch documents as deterministic


def assert_math_mode(framework: str, precision: str, math_mode: dict) -> None:
    """describe()'s math mode for a CPU key: exactly the expected keys, each with its value."""
    if framework == "torch":
        assert set(math_mode) == {*TORCH_MODE[precision], "deterministic_algorithms", "CUBLAS_WORKSPACE_CONFIG"}, math_mode
        for name, value in TORCH_MODE[precision].items():
            assert type(math_mode[name]) is type(value) and math_mode[name] == value, (name, math_mode)
        assert math_mode["deterministic_algorithms"] is True, math_mode
        assert math_mode["CUBLAS_WORKSPACE_CONFIG"] in DETERMINISTIC_CUBLAS, math_mode
    elif framework == "jax":
        from adapters.jax_adapter import DETERMINISTIC_FLAG

        assert set(math_mode) == {*JAX_MODE[precision], "XLA_FLAGS"}, math_mode
        for name, value in JAX_MODE[precision].items():
            assert type(math_mode[name]) is type(value) and math_mode[name] == value, (name, math_mode)
        assert DETERMINISTIC_FLAG in math_mode["XLA_FLAGS"].split(), math_mode
    else:
        assert framework == "numpy", framework
        assert math_mode == NUMPY_MODE, math_mode


def framework_math_mode(framework: str) -> dict:
    """The math mode the process is in now, read from the framework itself (not describe())."""
    if framework == "torch":
        import torch

        return {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        }
    if framework == "jax":
        import jax

        return {"jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision), "jax_enable_x64": bool(jax.config.jax_enable_x64)}
    return {}


@pytest.mark.parametrize("precision", registry.PRECISIONS)
@pytest.mark.parametrize("framework", CPU_FRAMEWORKS)
def test_describe_records_the_math_mode(framework, precision):
    adapter = adapter_or_skip(framework)
    try:
        info = adapter.describe(registry.RunKey(framework, "cpu", precision=precision))
        assert info["version"] and "device_name" in info
        assert_math_mode(framework, precision, info["math_mode"])
        # what it records is the process's state, not a constant
        now = framework_math_mode(framework)
        assert {name: info["math_mode"][name] for name in now} == now
    finally:  # the flags are the process's: leave them strict, as the other tests expect
        adapter.describe(registry.RunKey(framework, "cpu"))


def test_the_math_mode_check_rejects_wrong_values():
    """assert_math_mode catches each value of each key set wrong, a key left out and one added."""
    right = {
        ("torch", precision): {**mode, "deterministic_algorithms": True, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        for precision, mode in TORCH_MODE.items()
    }
    right |= {("jax", precision): {**mode, "XLA_FLAGS": "--xla_gpu_deterministic_ops=true"} for precision, mode in JAX_MODE.items()}
    right |= {("numpy", precision): dict(NUMPY_MODE) for precision in registry.PRECISIONS}
    for (framework, precision), mode in right.items():
        assert_math_mode(framework, precision, mode)
        for name, value in mode.items():
            wrong = not value if isinstance(value, bool) else ("" if name == "XLA_FLAGS" else f"{value}-not")
            with pytest.raises(AssertionError):
                assert_math_mode(framework, precision, {**mode, name: wrong})
            with pytest.raises(AssertionError):
                assert_math_mode(framework, precision, {k: v for k, v in mode.items() if k != name})
        with pytest.raises(AssertionError):
            assert_math_mode(framework, precision, {**mode, "extra": 1})
    # a mode right for one precision is wrong for another
    with pytest.raises(AssertionError):
        assert_math_mode("torch", "strict", right["torch", "tf32"])
    with pytest.raises(AssertionError):
        assert_math_mode("jax", "float64", right["jax", "strict"])


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_the_math_mode_check_catches_an_adapter_that_ignores_the_precision(framework, monkeypatch):
    """A broken adapter whose build sets one math mode whatever the key asks for: describe()
    reports that mode, and assert_math_mode rejects it."""
    adapter = adapter_or_skip(framework)
    strict, float64 = registry.RunKey(framework, "cpu"), registry.RunKey(framework, "cpu", precision="float64")
    adapter.describe(strict)
    with monkeypatch.context() as patch:
        if framework == "torch":  # always TF32
            configure = adapter._configure
            patch.setattr(adapter, "_configure", lambda torch, precision: configure(torch, "tf32"))
            key = strict
        else:  # never sets x64 (nor the matmul precision)
            jax_of = adapter._jax
            patch.setattr(adapter, "_jax", lambda precision=None: jax_of(None))
            key = float64
        broken = adapter.describe(key)["math_mode"]
    adapter.describe(strict)
    with pytest.raises(AssertionError):
        assert_math_mode(framework, key.precision, broken)
    assert_math_mode(framework, "strict", adapter.describe(strict)["math_mode"])


# The reason each GPU adapter gives, by what its framework says about this host: not
# installed, installed without a usable GPU, or a GPU it can use (no reason).
MISSING = {"torch": ("torch is not installed (",), "jax": ("jax, flax or optax is not installed (",), "cupy": ("cupy is not installed (",)}
NO_DEVICE = {
    "torch": ("torch finds no usable CUDA device",),
    "jax": ("jax finds no gpu device (",),
    "cupy": ("cupy finds no usable CUDA device", "cupy cannot use the GPU: "),
}
TOP_MODULES = {"torch": ("torch",), "jax": ("jax", "flax", "optax"), "cupy": ("cupy",)}


def gpu_on_this_host(framework: str) -> str:
    """'missing', 'no device' or 'available': the framework's own answer, not the adapter's."""
    if any(importlib.util.find_spec(name) is None for name in TOP_MODULES[framework]):
        return "missing"
    try:
        if framework == "torch":
            import torch

            return "available" if torch.cuda.is_available() else "no device"
        if framework == "jax":
            import jax

            try:
                return "available" if jax.devices("gpu") else "no device"
            except RuntimeError:
                return "no device"
        import cupy

        try:
            return "available" if cupy.is_available() else "no device"
        except Exception:
            return "no device"
    except ImportError:
        return "missing"


def assert_gpu_reason(framework: str, on_host: str, reason) -> None:
    """None where the framework can use a GPU; else a reason that says which case it is."""
    if on_host == "available":
        assert reason is None, f"{framework} has a usable GPU here, but the adapter says: {reason!r}"
        return
    assert isinstance(reason, str) and reason.strip(), f"{framework}: {on_host}, but the adapter gives no reason ({reason!r})"
    expected = (MISSING if on_host == "missing" else NO_DEVICE)[framework]
    assert reason.startswith(expected), f"{framework}: {on_host}, but the adapter says {reason!r}, not one of {expected}"


def test_no_gpu_is_a_reason_not_a_crash(monkeypatch):
    assert set(GPU_FRAMEWORKS) == {"torch", "jax", "cupy"}
    for framework in GPU_FRAMEWORKS:
        module = registry.load(framework)  # an adapter module imports no framework: this never fails
        key = key_for(module, "gpu")
        reason = module.unavailable(key)  # first, as before: the adapter sets up its framework's environment
        assert_gpu_reason(framework, gpu_on_this_host(framework), reason)
        # on any host: with the framework gone, the reason says it is not installed (no crash)
        with monkeypatch.context() as patch:
            for name in TOP_MODULES[framework]:
                patch.setitem(sys.modules, name, None)  # `import name` raises ImportError
            assert_gpu_reason(framework, "missing", module.unavailable(key))


def test_the_gpu_reason_check_rejects_a_wrong_reason():
    for framework in GPU_FRAMEWORKS:
        assert_gpu_reason(framework, "missing", MISSING[framework][0] + "No module named x)")
        assert_gpu_reason(framework, "no device", NO_DEVICE[framework][0])
        assert_gpu_reason(framework, "available", None)
        wrong = [
            ("no device", None),  # claims a GPU that is not there
            ("no device", ""),
            ("no device", MISSING[framework][0] + "x)"),  # installed, yet 'not installed'
            ("missing", None),
            ("missing", NO_DEVICE[framework][0]),
            ("available", NO_DEVICE[framework][0]),  # a usable GPU, refused
        ]
        for on_host, reason in wrong:
            with pytest.raises(AssertionError):
                assert_gpu_reason(framework, on_host, reason)


@pytest.mark.gpu
@pytest.mark.parametrize("framework", GPU_FRAMEWORKS)
def test_gpu_adapter_matches_oracle_after_one_step(framework, oracle_step):
    adapter = adapter_or_skip(framework, "gpu")
    problem, (ref_out, ref_loss, ref_params) = oracle_step("moons_net")
    trainer = trainer_of(adapter, problem, "gpu", "float32")
    adapter.warm_up(trainer)
    tol = UNIT_TOLERANCES.initial_outputs
    np.testing.assert_allclose(adapter.predict(trainer, problem.probe), ref_out, rtol=tol.rtol, atol=tol.atol)
    loss = first_loss(adapter, trainer)
    assert loss == pytest.approx(ref_loss, rel=UNIT_TOLERANCES.initial_loss.rtol)
    tol = UNIT_TOLERANCES.params_after_first_step
    params = adapter.state(trainer, 0).params
    assert list(params) == list(ref_params)
    for tensor, ref in ref_params.items():
        np.testing.assert_allclose(params[tensor], ref, rtol=tol.rtol, atol=tol.atol, err_msg=tensor)


@pytest.mark.parametrize("name", sorted(registry.ADAPTERS))
def test_every_adapter_satisfies_the_protocol(name):
    """Each registered adapter module has every function of adapters.protocol.Adapter, and of
    each optional capability it has, with the same parameters in the same order and the
    same defaults (imports no framework)."""
    import inspect

    from adapters.protocol import CAPABILITIES, Adapter

    module = importlib.import_module(registry.ADAPTERS[name])
    assert isinstance(module, Adapter)
    for contract in (Adapter, *(c for c in CAPABILITIES if isinstance(module, c))):
        for member, expected in inspect.getmembers(contract, inspect.isfunction):
            if member.startswith("_"):
                continue
            wanted = [(p.name, p.default) for p in list(inspect.signature(expected).parameters.values())[1:]]
            got = [(p.name, p.default) for p in inspect.signature(getattr(module, member)).parameters.values()]
            assert got == wanted, f"{name}.{member}{inspect.signature(getattr(module, member))}"
    assert module.NAME in (name, "xp")  # xp: the array-module code, NumPy's and CuPy's


def test_a_capability_is_checked_by_its_protocol():
    """An adapter without a capability's function is not taken for one that has it."""
    import types

    from adapters.protocol import Adapter, LoadsState

    real = importlib.import_module(registry.ADAPTERS["numpy"])
    without = types.SimpleNamespace(**{k: v for k, v in vars(real).items() if k != "load_state"})
    assert isinstance(without, Adapter) and not isinstance(without, LoadsState)
    assert isinstance(real, LoadsState)


def test_each_run_key_brings_its_own_precision_no_module_global():
    """Precision is an argument: two keys in one process, one after the other, each get the
    math mode they name (the last one, strict, leaves the process as the other tests expect)."""
    for name in CPU_FRAMEWORKS:
        module = registry.load(name)
        assert not hasattr(module, "configure") and not hasattr(module, "_PRECISION"), name
    torch = adapter_or_skip("torch")
    assert torch.describe(registry.RunKey("torch", "cpu", precision="tf32"))["math_mode"]["float32_matmul_precision"] == "high"
    assert torch.describe(registry.RunKey("torch", "cpu"))["math_mode"]["float32_matmul_precision"] == "highest"
    jax = adapter_or_skip("jax")
    assert jax.describe(registry.RunKey("jax", "cpu", precision="float64"))["math_mode"]["jax_enable_x64"] is True
    assert jax.describe(registry.RunKey("jax", "cpu"))["math_mode"]["jax_enable_x64"] is False


@pytest.mark.parametrize("spec_name", ["lenet_mnist", "cnn_norm_mnist", "gpl_transformer"])
def test_the_oracles_evaluation_takes_blocks_and_rounds_like_one_pass(spec_name, monkeypatch):
    """The float64 oracle evaluates a whole set EVAL_BLOCK examples at a time (a LeNet's
    windows on 8,000 images were one 1.25 GB array): on the real MNIST images and the GPL's
    text, after steps that move every tensor and batch norm's statistics, the blocks'
    outputs are one pass's to a few float64 roundings (dgemm rounds a few rows of an odd
    count otherwise: 1 ulp in 7 of 1,529 here; docs/measurements.md). A float32 run and a
    member still take one pass: their bits would move (sgemm's; a member's draws)."""
    from adapters import xp_adapter
    from harness.inputs.members import reordered
    from harness.reference import network

    adapter = registry.load("numpy")
    problem = quick_problem(spec_name)
    trainer = trainer_of(adapter, problem, "cpu", "float64")
    adapter.train(trainer, 0, 3)
    x = problem.x_train[: 3 * xp_adapter.EVAL_BLOCK - 7]  # gpl_transformer has 970
    block, n = xp_adapter.EVAL_BLOCK, len(x)
    passes = []
    real = network.predict

    def counted(xp, placed, params, batch, jitter, autocast=None):
        passes.append(len(batch))
        return real(xp, placed, params, batch, jitter, autocast)

    monkeypatch.setattr(network, "predict", counted)
    blocks = adapter.predict(trainer, x)
    assert n > block and passes == [min(block, n - i) for i in range(0, n, block)]
    one_pass = real(np, trainer.placed, trainer.params, x.astype(np.float64), network.plain)
    assert blocks.dtype == np.float64 and blocks.shape == one_pass.shape
    ulps = np.abs(blocks - one_pass) / np.spacing(np.abs(one_pass).max(axis=-1, keepdims=True))
    assert ulps.max() <= 4, f"blocks differ from one pass by {ulps.max():.1f} ulps of the row's largest output"
    for other in (trainer_of(adapter, problem, "cpu", "float32"), trainer_of(adapter, reordered(problem, 1), "cpu", "float64")):
        passes.clear()
        adapter.predict(other, x)
        assert passes == [len(x)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torchs_predictions_of_a_conv_net_in_chunks_are_the_whole_calls_bitwise(dtype, monkeypatch):
    """torch_adapter.predict takes a convolutional network's examples PREDICT_CHUNK at a time
    on the CPU (faster, docs/measurements.md): its outputs are the whole call's, bit for bit,
    on the committed conv spec (the records stay as they were); no examples is one call."""
    from harness.core.registry import FLOAT64, RunKey
    from harness.inputs.problem import build_problem
    from harness.spec.load import load_spec
    from tests.conftest import ROOT

    torch_adapter = adapter_or_skip("torch")
    problem = build_problem(load_spec(ROOT / "specs" / "cnn_norm_mnist.yaml", "quick"))
    key = RunKey("torch", "cpu", precision=FLOAT64) if dtype == "float64" else RunKey("torch", "cpu")
    trainer = torch_adapter.build(problem, torch_adapter.put(problem, key), key)
    x = problem.x_train[:700]
    monkeypatch.setattr(torch_adapter, "PREDICT_CHUNK", 10**9)
    whole, empty = torch_adapter.predict(trainer, x), torch_adapter.predict(trainer, x[:0])
    monkeypatch.setattr(torch_adapter, "PREDICT_CHUNK", 256)  # 3 chunks, the last of 188
    assert np.array_equal(torch_adapter.predict(trainer, x), whole)
    assert torch_adapter.predict(trainer, x[:0]).shape == empty.shape == (0, whole.shape[1])
