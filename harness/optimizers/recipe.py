"""What every optimizer kind shares: the recipe around its update rule (weight decay,
global-norm clipping, a learning-rate schedule) and the schedules. The spec states the math
once; each adapter expresses it with its library's own parts (torch.optim and its
lr_scheduler, torch.nn.utils.clip_grad_norm_; an optax.chain), and where a library's formula
differs from the one stated here, harness/known_differences.yaml says so.

The math, at update t (t = 0 for the first), with g the gradient of the loss:
1. clipping: g <- g * max_norm / ||g|| when the global norm ||g|| (over every trained
   tensor) exceeds max_norm (optax.clip_by_global_norm's formula);
2. coupled weight decay (every kind whose Section says `coupled_decay`): g <- g + weight_decay * p;
3. the rate: lr_t = lr * schedule(t);
4. the kind's own update rule at rate lr_t (harness/optimizers/<kind>.py).
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from harness.core.strict import Strict

MAX_STEP = 10**9
StepCount = Annotated[int, Field(gt=0, le=MAX_STEP)]
Rate = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
Beta = Annotated[float, Field(ge=0, lt=1)]
Decay = Annotated[float, Field(ge=0, le=1)]


class Constant(Strict):
    """schedule(t) = 1."""

    kind: Literal["constant"]

    def factor(self, t: int) -> float:
        return 1.0


class StepDecay(Strict):
    """schedule(t) = gamma ** (t // every): torch's StepLR, optax's exponential_decay with
    staircase=True."""

    kind: Literal["step"]
    every: StepCount
    gamma: Rate

    def factor(self, t: int) -> float:
        return self.gamma ** (t // self.every)


class WarmupCosine(Strict):
    """optax.warmup_cosine_decay_schedule with its peak at lr: linear from init_fraction to 1
    over warmup_steps, then half a cosine down to end_fraction at decay_steps (counted from
    t = 0, the warmup included), held there after."""

    kind: Literal["warmup_cosine"]
    warmup_steps: Annotated[int, Field(ge=0, le=MAX_STEP)]
    decay_steps: StepCount
    init_fraction: Fraction = 0.0
    end_fraction: Fraction = 0.0

    @model_validator(mode="after")
    def _ordered(self) -> WarmupCosine:
        if self.decay_steps <= self.warmup_steps:
            raise ValueError("decay_steps: must be larger than warmup_steps (it counts the warmup too)")
        return self

    def factor(self, t: int) -> float:
        if t < self.warmup_steps:
            return self.init_fraction + (1 - self.init_fraction) * t / self.warmup_steps
        span = self.decay_steps - self.warmup_steps
        cosine = 0.5 * (1 + math.cos(math.pi * min(t - self.warmup_steps, span) / span))
        return (1 - self.end_fraction) * cosine + self.end_fraction


Schedule = Annotated[Constant | StepDecay | WarmupCosine, Field(discriminator="kind")]


class Recipe(Strict):
    """What every optimizer takes around its update rule."""

    lr: Rate
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    clip_global_norm: Rate | None = None
    schedule: Schedule | None = None

    def lr_at(self, t: int) -> float:
        """The rate of update t (t = 0 for the first): lr itself without a schedule, so
        that a spec without one keeps every bit it had."""
        return self.lr if self.schedule is None else self.lr * self.schedule.factor(t)

    # Whether weight_decay is added to the gradient (coupled), and whether the update rule
    # alone, with no recipe around it, is one the fast paths train (Section of each kind).
    coupled_decay: ClassVar[bool] = True
    fast_rule: ClassVar[bool] = False

    @property
    def plain(self) -> bool:
        """The update rule alone (no decay, clipping, schedule or momentum) of a kind the
        fast paths train."""
        recipe = self.weight_decay or self.clip_global_norm is not None or self.schedule is not None or getattr(self, "momentum", 0)
        return not recipe and self.fast_rule
