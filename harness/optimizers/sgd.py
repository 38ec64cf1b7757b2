"""`sgd`: gradient descent, with torch.optim.SGD's momentum buffer, dampening and Nesterov
form: with momentum, b <- g at the first update and b <- momentum * b + (1 - dampening) * g
after it; the step is g + momentum * b with nesterov, else b; p <- p - lr_t * step."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from harness.layers.base import plain
from harness.optimizers.recipe import Decay, Recipe

KIND = "sgd"


class Sgd(Recipe):
    """Gradient descent, with torch.optim.SGD's momentum buffer, dampening and Nesterov
    form; weight_decay is coupled (added to the gradient)."""

    kind: Literal["sgd"]
    momentum: Decay = 0.0
    nesterov: bool = False
    dampening: Decay = 0.0

    fast_rule: ClassVar[bool] = True

    @model_validator(mode="after")
    def _nesterov(self) -> Sgd:
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov: needs a momentum above 0 and no dampening")
        if self.dampening and not self.momentum:
            raise ValueError("dampening: applies to a momentum buffer; set momentum too")
        return self


Section = Sgd


def cost(opt: Sgd) -> tuple[int, int]:
    """Float operations and state arrays per parameter, besides the parameter: p - lr * g;
    the momentum buffer's (2, Nesterov 2 more)."""
    if not opt.momentum:
        return 2, 0
    return 2 + 2 + (2 if opt.nesterov else 0), 1


def init(xp, opt: Sgd, params, names: list[str]):
    """The update count, and no momentum buffer yet: torch.optim makes it at the first update."""
    return {"t": 0, "buf": {}}


def state_at(opt: Sgd, step: int, moments):
    """The state after `step` updates, from a training state's moments (its `momentum`)."""
    return {"t": step, "buf": dict(moments.get("momentum", {}))}


def update(xp, params, grads, state, opt: Sgd, lr: float, jitter=plain, corrections=None):
    """torch.optim.SGD's update at rate `lr`."""
    if corrections is not None:
        raise ValueError("sgd: has no bias corrections to compute as a library does")
    buf = dict(state["buf"])
    new_params = dict(params)
    for name, g in grads.items():
        step = g
        if opt.momentum:
            b = g if name not in buf else jitter(opt.momentum * buf[name] + (1 - opt.dampening) * g)
            buf[name] = b
            step = jitter(g + opt.momentum * b) if opt.nesterov else b
        new_params[name] = params[name] - jitter(lr * step)
    return new_params, {"t": state["t"] + 1, "buf": buf}
