"""torch.optim's translation of a spec's optimizer and schedule (the torch adapter's,
adapters/torch_adapter.py): each optimizer kind's constructor and state names (OPTIMIZERS),
and lr_scheduler's schedules."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.core.errors import Unsupported


def _sgd(torch, params, opt, recipe):
    momentum = {"momentum": opt.momentum, "dampening": opt.dampening, "nesterov": opt.nesterov} if opt.momentum else {}
    return torch.optim.SGD(params, lr=opt.lr, **recipe, **momentum)


@dataclass(frozen=True)
class TorchRule:
    """How torch.optim expresses an optimizer kind: its constructor, called with the spec's
    section and the recipe's keywords (a coupled decay, the implementation); its state's names
    for the spec's moments; whether its state counts the updates (`step`)."""

    make: Callable[..., Any]
    slots: dict[str, str]
    counted: bool


OPTIMIZERS = {
    "adam": TorchRule(
        lambda torch, ps, o, r: torch.optim.Adam(ps, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, **r), {"m": "exp_avg", "v": "exp_avg_sq"}, True
    ),
    "adamw": TorchRule(
        lambda torch, ps, o, r: torch.optim.AdamW(ps, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay, **r),
        {"m": "exp_avg", "v": "exp_avg_sq"},
        True,
    ),
    "sgd": TorchRule(_sgd, {"momentum": "momentum_buffer"}, False),
    "rmsprop": TorchRule(
        lambda torch, ps, o, r: torch.optim.RMSprop(ps, lr=o.lr, alpha=o.alpha, eps=o.eps, momentum=o.momentum, **r),
        {"v": "square_avg", "momentum": "momentum_buffer"},
        True,
    ),
}


def rule(opt) -> TorchRule:
    if opt.kind not in OPTIMIZERS:
        raise Unsupported(f"torch: no torch.optim translation of optimizer {opt.kind!r}")
    return OPTIMIZERS[opt.kind]


def optimizer(torch, spec, model, **impl):
    """torch.optim's optimizer of the spec's kind (OPTIMIZERS) with its recipe (weight_decay
    is coupled where the kind's is, decoupled in AdamW); `impl` picks the implementation
    (fused, capturable), not the maths. A coupled decay is passed only where the spec sets
    one, so that a plain spec builds the optimizer it always did."""
    opt = spec.optimizer
    recipe = {"weight_decay": opt.weight_decay} if opt.weight_decay and opt.coupled_decay else {}
    return rule(opt).make(torch, model.parameters(), opt, {**recipe, **impl})


def scheduler(torch, spec, optimizer):
    """torch.optim.lr_scheduler's StepLR for a step schedule; LambdaLR with the spec's
    warmup-and-cosine multiplier, as transformers' get_cosine_schedule_with_warmup builds
    it (LinearLR refuses a start factor of 0, and CosineAnnealingLR is recursive and turns
    back up past T_max). Stepped after each optimizer.step(): update t runs at lr * f(t)."""
    schedule = spec.optimizer.schedule
    if schedule is None or schedule.kind == "constant":
        return None
    if schedule.kind == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=schedule.every, gamma=schedule.gamma)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)


def held_in(model, optimizer) -> dict[str, str]:
    """The lowest dtype the model's parameters and the optimizer's state are held in (a bf16
    run's record, adapters/protocol.py RecordsComputedIn): the state's floating tensors, or,
    before its first step, its parameters' (torch.optim creates each moment in its
    parameter's dtype, zeros_like or a clone of the gradient)."""
    params = [p.dtype for p in model.parameters()]
    if not params:
        return {}
    state = [v.dtype for s in optimizer.state.values() for v in s.values() if getattr(v, "is_floating_point", lambda: False)() and v.dim() > 0]
    lowest = lambda dtypes: str(min(dtypes, key=lambda d: d.itemsize)).removeprefix("torch.")  # noqa: E731
    return {"parameters": lowest(params), "optimizer state": lowest(state or params)}
