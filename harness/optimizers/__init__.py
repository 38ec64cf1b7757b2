"""The optimizer registry: one module per optimizer kind, as harness/layers has one per layer
kind. Each owns its spec section (a Recipe: the rate, decay, clipping and schedule every kind
takes, harness/optimizers/recipe.py), the oracle's state and update rule in the array-module
code (init, update), its state's names for checkpoints and re-anchoring (state_at, from the
moments `m`, `v` and `momentum` of harness/reference/network.py's training state), and its
cost per parameter for the floor (cost).

A kind's module has: KIND, Section, cost, init, state_at and update. A new kind is one module
here plus one line in each adapter's table (adapters/torch_optim.py OPTIMIZERS,
adapters/jax_adapter.py OPTIMIZERS); a kind an adapter's table lacks is an error there,
never another kind's update.
"""

from __future__ import annotations

from types import ModuleType
from typing import Annotated

from pydantic import Field

from harness.optimizers import adam, adamw, rmsprop, sgd

KINDS: dict[str, ModuleType] = {m.KIND: m for m in (adam, adamw, rmsprop, sgd)}
OPTIMIZER_KINDS = tuple(KINDS)

Optimizer = Annotated[adam.Adam | adamw.AdamW | sgd.Sgd | rmsprop.RMSprop, Field(discriminator="kind")]


def rule(opt) -> ModuleType:
    """The module of an optimizer section's kind; a ValueError for a kind none has."""
    try:
        return KINDS[opt.kind]
    except KeyError:
        raise ValueError(f"optimizer.kind: {opt.kind!r} is none of {', '.join(KINDS)}") from None
