"""The PyTorch adapter: torch.nn layers, torch.nn.functional losses, torch.optim updates."""

from __future__ import annotations

import copy
import os
import platform
from dataclasses import dataclass
from typing import Any

import numpy as np

NAME = "torch"
_PRECISION = "strict"


def configure(precision: str) -> None:
    global _PRECISION
    _PRECISION = precision


def _torch():
    # cuBLAS reads this when it starts: deterministic GEMM workspaces (torch's documented rule).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    return torch


def _device(device: str) -> str:
    return "cuda" if device == "gpu" else "cpu"


def unavailable(device: str) -> str | None:
    try:
        torch = _torch()
    except ImportError as exc:
        return f"torch is not installed ({exc})"
    if device == "gpu" and not torch.cuda.is_available():
        return "torch finds no usable CUDA device"
    return None


def _configure(torch) -> None:
    """Deterministic kernels, and full float32 products unless TF32 was asked for."""
    tf32 = _PRECISION == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.use_deterministic_algorithms(True)


def describe(device: str) -> dict[str, Any]:
    torch = _torch()
    _configure(torch)
    name = torch.cuda.get_device_name() if device == "gpu" else platform.processor() or platform.machine()
    return {
        "library": "torch",
        "version": torch.__version__,
        "device_name": name,
        "math_mode": {
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        },
        "threads": torch.get_num_threads(),
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


def put(problem, device: str, dtype: str) -> dict[str, Any]:
    torch = _torch()
    dev = _device(device)
    arrays = {"x": problem.x_train.astype(dtype), "y": problem.y_train}
    if problem.spec.loss.kind == "mse":
        arrays["y"] = problem.y_train.astype(dtype)
    if problem.batch_order is not None:
        arrays["order"] = problem.batch_order
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in arrays.items()}


def _model(torch, spec, params, dev, dtype):
    acts = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}
    modules = []
    for (w, b), layer in zip(params, spec.model.layers):
        linear = torch.nn.Linear(w.shape[0], w.shape[1], device=dev, dtype=dtype)
        with torch.no_grad():  # nn.Linear stores (out, in): transpose the harness's (in, out)
            linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
            linear.bias.copy_(torch.from_numpy(b))
        modules.append(linear)
        if layer.activation in acts:
            modules.append(acts[layer.activation]())
    return torch.nn.Sequential(*modules)


def _optimizer(torch, spec, model):
    opt = spec.optimizer
    if opt.kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps)
    return torch.optim.SGD(model.parameters(), lr=opt.lr)


def build(problem, data: dict[str, Any], device: str, dtype: str) -> Trainer:
    torch = _torch()
    _configure(torch)
    torch_dtype = getattr(torch, dtype)
    model = _model(torch, problem.spec, problem.initial_params, _device(device), torch_dtype)
    log = torch.zeros(problem.total_steps, dtype=torch_dtype, device=_device(device))
    optimizer = _optimizer(torch, problem.spec, model)
    return Trainer(problem, device, torch_dtype, data, model, optimizer, len(problem.x_train), log)


def _loss(torch, spec, model, n_examples: int, outputs, targets):
    f = torch.nn.functional
    if spec.kind == "mse":
        value = f.mse_loss(outputs, targets, reduction=spec.reduction)
    else:
        value = f.cross_entropy(outputs, targets, reduction=spec.reduction)
    if spec.l2 is not None:
        scale = spec.l2.coefficient / 2 / (n_examples if spec.l2.divide_by_examples else 1)
        weights = [m.weight for m in model if isinstance(m, torch.nn.Linear)]
        value = value + scale * sum(w.pow(2).sum() for w in weights)
    return value


def _train_step(trainer: Trainer, model, optimizer, step: int):
    torch = _torch()
    x, y = trainer.problem.batch(trainer.data, step)
    optimizer.zero_grad(set_to_none=True)
    loss = _loss(torch, trainer.problem.spec.loss, model, trainer.n_examples, model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def warm_up(trainer: Trainer) -> None:
    """One step on a copy of the model and optimizer: kernels and allocator warm, state untouched."""
    torch = _torch()
    model = copy.deepcopy(trainer.model)
    _train_step(trainer, model, _optimizer(torch, trainer.problem.spec, model), 0)


def step(trainer: Trainer, t: int) -> None:
    # Written into a preallocated log: keeping 20,000 loss tensors alive instead fragmented
    # glibc's heap between the large activation buffers (24 GB after 3,000 moons steps).
    trainer.loss_log[t] = _train_step(trainer, trainer.model, trainer.optimizer, t)


def synchronize(trainer: Trainer) -> None:
    if trainer.device == "gpu":
        _torch().cuda.synchronize()


def losses(trainer: Trainer, upto: int) -> np.ndarray:
    return trainer.loss_log[:upto].cpu().double().numpy()


def params(trainer: Trainer):
    linears = [m for m in trainer.model if isinstance(m, _torch().nn.Linear)]
    return [(m.weight.detach().cpu().numpy().T.copy(), m.bias.detach().cpu().numpy().copy()) for m in linears]


def predict(trainer: Trainer, x: np.ndarray) -> np.ndarray:
    torch = _torch()
    with torch.no_grad():
        inputs = torch.from_numpy(np.ascontiguousarray(x)).to(device=_device(trainer.device), dtype=trainer.dtype)
        return trainer.model(inputs).cpu().double().numpy()
