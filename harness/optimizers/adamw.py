"""`adamw`: Adam with decoupled weight decay (Loshchilov & Hutter): the parameters shrink by
lr_t * weight_decay before Adam's update (harness/optimizers/adam.py)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from harness.layers.base import plain
from harness.optimizers import adam

KIND = "adamw"


class AdamW(adam.Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): the parameters shrink by
    lr_t * weight_decay before Adam's update. weight_decay has no default here: torch's is
    1e-2 and optax's 1e-4, and a port that leaves it out changes the math."""

    kind: Literal["adamw"]  # type: ignore[assignment]
    weight_decay: Annotated[float, Field(ge=0)]

    coupled_decay: ClassVar[bool] = False
    fast_rule: ClassVar[bool] = False


Section = AdamW
init, state_at = adam.init, adam.state_at


def cost(opt: AdamW) -> tuple[int, int]:
    """Adam's, and the decay's two operations."""
    return 14, 2


def update(xp, params, grads, state, opt: AdamW, lr: float, jitter=plain, corrections=None):
    """Adam's update (looked up at each call, so that a test's replacement of it holds here
    too), which shrinks the parameters first: this Section's decay is decoupled."""
    return adam.update(xp, params, grads, state, opt, lr, jitter=jitter, corrections=corrections)
