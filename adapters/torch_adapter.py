"""The PyTorch adapter: torch.nn layers, torch.nn.functional losses, torch.optim updates.
Each layer kind of the spec is translated into torch.nn's own modules (adapters/torch_layers.py).

mode "eager" is the article-style loop. mode "fast" trains the same model with the same
torch.optim update: on the CPU the forward and loss are torch.compile'd (inductor, with
AOTAutograd's compiled backward) per batch size and the update is torch.optim's fused CPU
kernel; on the GPU each step (forward, loss, backward, fused capturable update, loss log)
is one CUDA graph per batch size, replayed with no host synchronisation.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import platform
from dataclasses import dataclass
from typing import Any

import numpy as np

from adapters import timing, torch_bf16, torch_fast, torch_layers, torch_port
from adapters.protocol import State
from adapters.torch_optim import held_in
from adapters.torch_optim import optimizer as _optimizer
from adapters.torch_optim import rule as _rule
from adapters.torch_optim import scheduler as _scheduler
from harness.core.errors import Unsupported
from harness.core.registry import BF16, TF32
from harness.optimizers import adam
from harness.reference import network

NAME = "torch"


def _torch():
    # cuBLAS reads this when it starts: deterministic GEMM workspaces (torch's documented rule).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    return torch


def _device(device: str) -> str:
    return "cuda" if device == "gpu" else "cpu"


def unavailable(key) -> str | None:
    try:
        torch = _torch()
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    if key.device == "gpu" and not torch.cuda.is_available():
        return "torch finds no usable CUDA device"
    return None


def _configure(torch, precision: str) -> None:
    """Deterministic kernels, and full float32 products unless TF32 was asked for (the
    flags are the process's: set again by every build, for the run it builds)."""
    tf32 = precision == TF32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.use_deterministic_algorithms(True)
    # torch's default, pinned: cuDNN's benchmarking times algorithms and may pick another one
    # each run (torch's notes on reproducibility)
    torch.backends.cudnn.benchmark = False


FAST_MODE = {
    "cpu": "torch.compile (inductor, static shapes) of forward + loss + backward, one graph per batch size, "
    "compiled in warm_up; torch.optim fused=True CPU update (dynamo does not trace fused optimizers; "
    "bias corrections in float64 as in eager)",
    "gpu": "whole step (forward, loss, backward, fused capturable torch.optim update, loss log) captured in one "
    "CUDA graph per batch size and replayed; a device-side step counter picks the log slot and the batch rows",
}


def describe(key) -> dict[str, Any]:
    torch = _torch()
    _configure(torch, key.precision)
    name = torch.cuda.get_device_name() if key.device == "gpu" else platform.processor() or platform.machine()
    fast = {"fast_mode": FAST_MODE[key.device]} if key.mode == "fast" else {}
    version = torch.__version__
    # the GPU's libraries, and cuDNN's algorithm choice (its convolutions and batch norm)
    gpu = {}
    if key.device == "gpu":
        version += f" (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})"
        gpu = {"cudnn.benchmark": torch.backends.cudnn.benchmark, "cudnn.deterministic": torch.backends.cudnn.deterministic}
    return {
        "library": "torch",
        "version": version,
        "device_name": name,
        "math_mode": {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            **({"autocast": "bfloat16"} if key.precision == BF16 else {}),
            **gpu,
        },
        "threads": torch.get_num_threads(),
        **fast,
    }


@dataclass
class Trainer:
    problem: Any
    device: str
    dtype: Any
    data: dict[str, Any]
    model: Any
    optimizer: Any
    n_examples: int
    loss_log: Any
    mode: str = "eager"
    fast: Any = None  # torch_fast.Fast in mode "fast"
    scheduler: Any = None  # torch.optim.lr_scheduler's, where the spec has a schedule
    bf16: bool = False  # forward passes and the loss under torch.autocast(dtype=torch.bfloat16)
    xla_sums: list | None = None  # a bf16 member's biases' cotangents, their gradients summed as XLA:CPU sums them (torch_bf16.as_xla)


def _autocast(torch, trainer: Trainer):
    """torch's own mixed precision for a bf16 run: autocast on the run's device in bfloat16
    (its lists of ops computed in bf16 and kept in float32), parameters float32; else nothing."""
    if not trainer.bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=_device(trainer.device), dtype=torch.bfloat16)


def put(problem, key) -> dict[str, Any]:
    torch = _torch()
    dev = _device(key.device)
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in problem.host_arrays(key.dtype).items()}


def _network(torch, problem, params: dict[str, np.ndarray], device: str, dtype):
    """The network holding `params`: the spec's layers (adapters/torch_layers.py), or a
    port's own module (adapters/torch_port.py)."""
    if problem.port is not None:
        return torch_port.network(torch, problem, params, device, dtype)
    return torch_layers.network(torch, problem.spec, params, device, dtype)


def _tensors(trainer: Trainer) -> dict[str, np.ndarray]:
    """Every tensor by the spec's names (a port's: its state_dict's), in the spec's layout."""
    if trainer.problem.port is not None:
        return torch_port.tensors(trainer.model)
    return torch_layers.tensors(trainer.model, trainer.problem.spec)


def build(problem, data: dict[str, Any], key) -> Trainer:
    device, dtype, mode = key.device, key.dtype, key.mode
    torch = _torch()
    _configure(torch, key.precision)
    torch_dtype = getattr(torch, dtype)
    if mode == "fast" and problem.port is not None and (device == "gpu" or problem.port_dropout):
        why = "on the GPU (its CUDA graphs)" if device == "gpu" else "with dropout (turned off by a TorchFunctionMode, not traced)"
        raise Unsupported(f"torch's fast mode does not take a port {why} yet; {problem.spec.name} is one (run it eager)")
    if mode == "fast" and device == "gpu" and problem.masks:
        # a documented limit, skipped with this reason (the first GPU contact's smoke failed the run instead)
        raise Unsupported(f"torch's CUDA-graph fast mode does not take dropout masks yet; {problem.spec.name} has dropout (run it eager)")
    model = _network(torch, problem, problem.initial_params, _device(device), torch_dtype)
    log = torch.zeros(problem.total_steps, dtype=torch_dtype, device=_device(device))
    if mode != "fast":
        optimizer = _optimizer(torch, problem.spec, model)
        trainer = Trainer(problem, device, torch_dtype, data, model, optimizer, len(problem.x_train), log)
        trainer.scheduler = _scheduler(torch, problem.spec, optimizer)
        trainer.bf16 = key.precision == BF16
        if trainer.bf16 and problem.xla_bf16_sums:
            trainer.xla_sums = torch_bf16.as_xla(torch, model)
        return trainer
    spec = problem.spec
    if not spec.plain_training:
        raise Unsupported(f"torch's fast mode takes plain SGD and Adam only; {spec.name} has a training recipe (run it eager)")
    # fused: one kernel for all parameters (its Adam takes 1 - beta^t in float64, as eager does);
    # capturable: Adam's step count stays on the GPU, as a CUDA graph needs
    impl = {"fused": True}
    if device == "gpu" and _rule(problem.spec.optimizer).counted:
        impl["capturable"] = True
    optimizer = _optimizer(torch, problem.spec, model, **impl)
    trainer = Trainer(problem, device, torch_dtype, data, model, optimizer, len(problem.x_train), log, mode)
    loss = problem.spec.loss
    trainer.fast = torch_fast.Fast(
        objective=(loss.kind, loss.reduction, network.l2_scale(loss, trainer.n_examples)),
        sizes=[stop - start for start, stop in problem.bounds],
        initial={k: v.detach().clone() for k, v in model.state_dict().items()},
    )
    if device == "gpu":
        torch_fast.gpu_tables(torch, trainer)
    return trainer


def _loss(torch, spec, model, n_examples: int, outputs, targets):
    return torch_layers.objective(torch, spec.kind, spec.reduction, network.l2_scale(spec, n_examples), model, outputs, targets, spec.label_smoothing)


def _train_step(trainer: Trainer, model, optimizer, step: int, scheduler=None):
    torch = _torch()
    x, y = trainer.problem.batch(trainer.data, step)
    masks = trainer.problem.step_masks(trainer.data, step)
    optimizer.zero_grad(set_to_none=True)
    spec = trainer.problem.spec
    with _autocast(torch, trainer):
        loss = _loss(torch, spec.loss, model, trainer.n_examples, model(x, masks), y)
    loss.backward()
    if trainer.xla_sums is not None:
        torch_bf16.replace_bias_grads(torch, trainer.xla_sums)
    if spec.optimizer.clip_global_norm is not None:
        _clip(torch, trainer.problem, list(model.parameters()), spec.optimizer.clip_global_norm)
    restore = _as_library(trainer.problem, optimizer, step)
    before = _kept_for_rounding(torch, trainer.problem, model, step)
    optimizer.step()
    for group, saved in zip(optimizer.param_groups, restore):
        group.update(saved)
    if before is not None:
        _round_update(torch, trainer.problem, optimizer, before, step)
    if scheduler is not None:
        scheduler.step()
    return loss.detach()


def _kept_for_rounding(torch, problem, model, step: int):
    """A port's calibration member over its jittered steps (adapters/torch_port.py rounds
    every module's output and gradient once more): the parameters before the update, for
    _round_update. None for every other run."""
    if problem.port is None or not problem.jittered(step):  # jittered: a member's steps only
        return None
    return [(p, p.detach().clone()) for p in model.parameters()]


def _round_update(torch, problem, optimizer, before, step: int) -> None:
    """The optimizer's arithmetic rounded once more, as the array-module members round their
    update's every array (harness.reference.network.jitter_function): each parameter's
    update and each of its optimizer moments moved at random (seeded by the member and the
    step) by at most two units in their last place. torch.optim's own step is untouched;
    another implementation (XLA's fused and contracted update) rounds it otherwise. Under a
    decoupled decay (AdamW), the parameter itself too, at its own size: torch.optim.AdamW
    rounds it there twice (p * (1 - lr wd), then its step), optax once (p + its update), as
    the array-module AdamW's members round the decayed parameter (harness/optimizers/adam.py);
    an update a thousand times smaller than the parameter rounds it nowhere else (a port
    of AdamW's members then kept its parameters within 1e-17 of the reference's over 30
    steps, 2026-11-26)."""
    rng = np.random.default_rng((problem.jitter_seed, step))
    opt = problem.spec.optimizer
    decoupled = opt.kind == "adamw" and opt.weight_decay != 0

    def u(p):  # one relative move per element, within an ulp of 1
        return torch_port.moves_like(torch, rng, p)

    with torch.no_grad():
        for p, old in before:
            update = p - old
            p.copy_(old + update + update * u(p))
            if decoupled:
                p.add_(p * u(p))
            for moment in optimizer.state.get(p, {}).values():
                if torch.is_tensor(moment) and moment.is_floating_point() and moment.shape == p.shape:
                    moment.add_(moment * u(p))


TORCH_CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6) (harness/known_differences.yaml)


def _clip(torch, problem, parameters: list, max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_. A port's reference or member computing another
    library's clipping (`problem.port_clip_eps`, optax's 0: max_norm / norm, the spec's)
    passes torch's clip_grads_with_norm_ the max_norm that turns its max_norm / (norm + 1e-6)
    into max_norm / (norm + eps); the clamp at 1 then clips where norm + eps > max_norm."""
    if problem.port_clip_eps is None:
        torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None])
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm * (norm + TORCH_CLIP_EPS) / (norm + problem.port_clip_eps), norm)


def _as_library(problem, optimizer, step: int) -> list[dict[str, float]]:
    """A port's reference or calibration member computing another library's catalogued
    formula (harness/inputs/library.py; roles.PORT_SCHEME), through torch.optim's own step:
    update `step` at the rate that library's schedule gives (`rates`), and Adam's bias
    corrections as optax computes them in float32 (`float32_corrections`). torch divides the
    rate by 1 - beta1^t and the root of v by sqrt(1 - beta2^t) in Python floats; with
    k = sqrt(c2 / c2'), the rate lr c1 / (c1' k) and the eps eps / k (AdamW's decay rescaled
    to keep lr * weight_decay) give lr / c1' * m / (sqrt(v) / sqrt(c2') + eps), the same
    update with optax's c1' and c2'. The group's values before the change are returned, to
    put back after the step. A framework's own run never gets these (its problem has
    neither), so it computes torch's."""
    if problem.rates is not None:
        for group in optimizer.param_groups:
            group["lr"] = problem.rates[step]
    if not problem.float32_corrections:
        return []
    opt = problem.spec.optimizer
    (c1, c2), (c1_32, c2_32) = adam.bias_corrections(opt, step + 1), adam.float32_bias_corrections(opt, step + 1)
    k = math.sqrt(c2 / c2_32)
    saved = []
    for group in optimizer.param_groups:
        saved.append({name: group[name] for name in ("lr", "eps", "weight_decay")})
        lr = group["lr"]
        group["lr"] = lr * c1 / (c1_32 * k)
        group["eps"] = opt.eps / k
        if opt.kind == "adamw" and group["lr"]:  # at a rate of 0 (a warmup's first step) nothing decays either way
            group["weight_decay"] = opt.weight_decay * lr / group["lr"]
    return saved


def load_state(trainer: Trainer, state: dict[str, np.ndarray], step: int) -> None:
    """Go on from a training state after `step` updates, as a torch checkpoint restores one:
    the model's tensors; optimizer.load_state_dict with each parameter's state (Adam's step,
    exp_avg and exp_avg_sq; SGD's momentum_buffer) and the rate of update `step`; the
    scheduler at that step."""
    if trainer.mode == "fast":
        raise ValueError("torch's fast mode starts from the initial state only (run it eager)")
    torch = _torch()
    spec, dev = trainer.problem.spec, _device(trainer.device)
    params, moments = network.split_training_state(state)
    trainer.model = _network(torch, trainer.problem, params, dev, trainer.dtype)
    if trainer.problem.port is not None:
        trainer.model.step = step  # where a member's jitter is (adapters/torch_port.py)
    trainer.optimizer = _optimizer(torch, spec, trainer.model)
    trainer.scheduler = _scheduler(torch, spec, trainer.optimizer)
    # each moment in torch's layout, in the model's order of parameters: a port's by name,
    # a spec's from a network of its layers built from it
    rule = _rule(spec.optimizer)
    if trainer.problem.port is not None:
        names = [name for name, _ in torch_port.trained(trainer.model)]
        held = {rule.slots[k]: [torch.from_numpy(np.ascontiguousarray(m[n])).to(dev, trainer.dtype) for n in names] for k, m in moments.items()}
    else:
        held = {rule.slots[k]: list(torch_layers.network(torch, spec, {**params, **m}, dev, trainer.dtype).parameters()) for k, m in moments.items()}
    scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # torch.optim's step dtype
    saved = trainer.optimizer.state_dict()
    for i in range(len(list(trainer.model.parameters()))):
        saved["state"][i] = {slot: tensors[i].detach().clone() for slot, tensors in held.items()}
        if rule.counted:
            saved["state"][i]["step"] = torch.tensor(float(step), dtype=scalar)
    for group in saved["param_groups"]:
        group["lr"] = spec.optimizer.lr_at(step)
    trainer.optimizer.load_state_dict(saved)
    if trainer.scheduler is not None:
        trainer.scheduler.last_epoch = step


def training_state(trainer: Trainer) -> dict[str, np.ndarray]:
    """The whole training state by the spec's names (the inverse of load_state): every tensor,
    and each optimizer moment of each trained tensor (`m/dense1.weight`, ...) as torch.optim
    holds it, read into a network of the same layers so that it has the spec's names and
    layout."""
    torch = _torch()
    spec = trainer.problem.spec
    if trainer.problem.port is not None:  # a port's moments by its parameters' names
        found = torch_port.tensors(trainer.model)
        for moment, slot in _rule(spec.optimizer).slots.items():
            held = {name: trainer.optimizer.state.get(p, {}).get(slot) for name, p in torch_port.trained(trainer.model)}
            if held and all(h is not None for h in held.values()):
                found.update({f"{moment}/{name}": h.detach().cpu().double().numpy() for name, h in held.items()})
        return found
    params = torch_layers.tensors(trainer.model, spec)
    found = dict(params)
    trained = set(network.trained_names(spec.model.placed))
    ordered = list(trainer.model.parameters())
    for moment, slot in _rule(spec.optimizer).slots.items():
        held = [trainer.optimizer.state.get(p, {}).get(slot) for p in ordered]
        if not held or any(h is None for h in held):
            continue
        holder = torch_layers.network(torch, spec, params, "cpu", torch.float64)
        with torch.no_grad():
            for into, value in zip(holder.parameters(), held):
                into.copy_(value.detach().to("cpu", torch.float64))
        found.update({f"{moment}/{name}": a for name, a in torch_layers.tensors(holder, spec).items() if name in trained})
    return found


def warm_up(trainer: Trainer, plan=()) -> None:
    """One step on a copy of the model and optimizer: kernels and allocator warm, state untouched.
    Fast mode: compile (CPU) or capture (GPU) on the trainer's own model and optimizer for every
    batch size the plan's steps use, then put their initial state back in place."""
    torch = _torch()
    if trainer.mode == "fast":
        torch_fast.warm_up(torch, trainer, plan)
        return
    model = copy.deepcopy(trainer.model)
    _train_step(trainer, model, _optimizer(torch, trainer.problem.spec, model), 0)


def train(trainer: Trainer, start: int, stop: int) -> None:
    if trainer.mode == "fast":
        torch_fast.train(_torch(), trainer, start, stop)
        return
    for t in range(start, stop):
        # Written into a preallocated log: keeping every step's loss tensor alive instead
        # fragments glibc's heap between the large activation buffers (docs/measurements.md).
        trainer.loss_log[t] = _train_step(trainer, trainer.model, trainer.optimizer, t, trainer.scheduler)


def synchronize(trainer: Trainer) -> None:
    if trainer.device == "gpu":
        _torch().cuda.synchronize()


def state(trainer: Trainer, upto: int) -> State:
    return State(trainer.loss_log[:upto].cpu().double().numpy(), _tensors(trainer))


def _inputs(torch, trainer: Trainer, x: np.ndarray):
    """x on the device: in the run's dtype, or a text's token ids as int64 (nn.Embedding's)."""
    tokens = trainer.problem.spec.model.tokens is not None
    return torch.from_numpy(np.ascontiguousarray(x)).to(device=_device(trainer.device), dtype=torch.int64 if tokens else trainer.dtype)


# The examples a convolutional network predicts at once on the CPU: over a whole set its
# activations leave the caches, and chunks of 256 read 2-3x faster (a residual CNN's 8,000
# MNIST images in float64: 9.8 s whole, 4.8 s chunked), their outputs bitwise the whole
# call's on every committed spec and port with a convolution. A dense layer's GEMM takes
# other kernels at other batch sizes (mnist_mlp's float64 outputs 5.6e-17 apart), and a
# GPU's convolution may choose another algorithm: those predict the whole set at once.
PREDICT_CHUNK = 256


def predict(trainer: Trainer, x: np.ndarray) -> np.ndarray:
    """The outputs in evaluation mode (running statistics, no dropout), then back to training."""
    torch = _torch()
    conv = trainer.device == "cpu" and any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in trainer.model.modules())
    step = PREDICT_CHUNK if conv else max(len(x), 1)
    trainer.model.eval()
    try:
        with torch.no_grad(), _autocast(torch, trainer):
            starts = range(0, len(x), step) or [0]  # no examples: one call, as the whole set's
            parts = [trainer.model(_inputs(torch, trainer, x[i : i + step]), {}).cpu().double().numpy() for i in starts]
            return np.concatenate(parts) if len(parts) != 1 else parts[0]
    finally:
        trainer.model.train()


def layer_outputs(trainer: Trainer, x: np.ndarray, masks: dict) -> dict[str, np.ndarray]:
    """Each layer's output of a training-mode forward pass of x (dropout masks given), on a
    copy of the model (batch norm's running statistics stay as they are)."""
    torch = _torch()
    model = copy.deepcopy(trainer.model)
    dev = _device(trainer.device)
    to = {"device": dev, "dtype": trainer.dtype}
    masks = {name: torch.from_numpy(np.ascontiguousarray(m)).to(**to) for name, m in masks.items()}
    with torch.no_grad(), _autocast(torch, trainer):
        return torch_layers.layer_outputs(model, _inputs(torch, trainer, x), masks)


def computed_in(trainer: Trainer) -> dict[str, str]:
    """The dtype each layer's output and the loss come out in on step 0's batch under the
    run's autocast (adapters/protocol.py RecordsComputedIn), on a copy of the model, and the
    lowest its parameters and optimizer state are held in (a port's alone: torch_optim.held_in)."""
    torch = _torch()
    held = held_in(trainer.model, trainer.optimizer)
    if trainer.problem.port is not None:
        return held
    model, found = copy.deepcopy(trainer.model), {}
    x, y = trainer.problem.batch(trainer.data, 0)
    model.train()
    with torch.no_grad(), _autocast(torch, trainer):
        loss = _loss(torch, trainer.problem.spec.loss, model, trainer.n_examples, model(x, trainer.problem.step_masks(trainer.data, 0), found), y)
    return {**{name: str(value.dtype).removeprefix("torch.") for name, value in {**found, "loss": loss}.items()}, **held}


def rates(device: str, precision: str) -> dict[str, float]:
    """torch's float32 product rate and copy bandwidth; on the GPU, also one kernel's cost
    inside a CUDA graph."""
    torch = _torch()
    if device == "gpu" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    dev = _device(device)
    torch.backends.cuda.matmul.allow_tf32 = precision == TF32
    sync = torch.cuda.synchronize if device == "gpu" else lambda: None
    n = timing.matmul_n(device)
    a = torch.rand(n, n, device=dev)
    out = torch.empty_like(a)
    matmul = 2 * n**3 / timing.best_seconds(lambda: torch.mm(a, a, out=out), sync)
    src = torch.ones(timing.copy_bytes(device) // 4, device=dev)
    dst = torch.empty_like(src)
    found = {"matmul": matmul, "bandwidth": 2 * src.numel() * 4 / timing.best_seconds(lambda: dst.copy_(src), sync)}
    if device == "gpu":
        found["launch"] = _graph_kernel_seconds(torch)
    return found


def _graph_kernel_seconds(torch) -> float:
    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1)  # warm the kernel before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(timing.GRAPH_KERNELS):
            x.add_(1)
    return timing.best_seconds(graph.replay, torch.cuda.synchronize) / timing.GRAPH_KERNELS
