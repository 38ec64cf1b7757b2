"""Injected bugs of the kinds people make when porting a training recipe between torch and
JAX, each a replacement of one function of adapters/torch_adapter.py (tests/test_injected_bugs.py
registers a copy of the adapter with it): the schedule one step off, coupled and decoupled
weight decay swapped, clipping with another eps, label smoothing over K - 1 classes,
Nesterov's formula dropped, and a learning rate that changes late in the run; and of
adapters/jax_adapter.py's optax chain (JAX_RECIPE_BUGS): each leaf clipped by its own norm,
AdamW's decay at the peak rate instead of the scheduled one. A JAX copy inherits optax's
catalogued differences (the float32 schedule and bias corrections), so each is a bug on
top of a known behaviour. RMSprop's: torch's centered form where the spec says uncentered;
optax.rmsprop's alias with its defaults (eps inside the square root, the rate before the
momentum trace) where the adapter chains optax's parts. Each says which generated specs it changes the math of
(tests/family.py)."""

from __future__ import annotations

from adapters import jax_adapter, torch_adapter
from harness.reference import network

LATE = 0.5  # the late change starts halfway through the run


def _clip_eps(parameters, max_norm):
    """Clipping written by hand with eps 1e-3 where torch's clip_grad_norm_ has 1e-6:
    max_norm / (norm + 1e-3), at most 1."""
    import torch

    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in parameters]))
    factor = torch.clamp(max_norm / (norm + 1e-3), max=1.0)
    for p in parameters:
        p.grad.mul_(factor)


def _train_step(schedule_first: bool = False, late: bool = False, clip=None, loss=None):
    """torch_adapter._train_step with one thing done otherwise: the scheduler stepped before
    the optimizer (update t at the rate of t + 1), the rate 0.1% higher from halfway
    through the run, the gradient clipped by `clip(parameters, max_norm)`, or the loss
    `loss` (torch_adapter._loss's arguments)."""

    def step_fn(trainer, model, optimizer, step, scheduler=None):
        torch = torch_adapter._torch()
        spec = trainer.problem.spec
        x, y = trainer.problem.batch(trainer.data, step)
        masks = trainer.problem.step_masks(trainer.data, step)
        if scheduler is not None and schedule_first:
            scheduler.step()
        run = trainer.problem.spec.training.epochs * len(trainer.problem.bounds)  # the whole run, in a twin too
        if late and step >= int(LATE * run):
            for group in optimizer.param_groups:
                group["lr"] = spec.optimizer.lr_at(step) * 1.001
        optimizer.zero_grad(set_to_none=True)
        value = (loss or torch_adapter._loss)(torch, spec.loss, model, trainer.n_examples, model(x, masks), y)
        value.backward()
        if spec.optimizer.clip_global_norm is not None:
            (clip or torch.nn.utils.clip_grad_norm_)(model.parameters(), spec.optimizer.clip_global_norm)
        optimizer.step()
        if scheduler is not None and not schedule_first:
            scheduler.step()
        return value.detach()

    return step_fn


def _smoothing_over_others(torch, spec, model, n_examples, outputs, targets):
    """Label smoothing written by hand: s / (K - 1) on the other classes, 1 - s on the label."""
    s = spec.label_smoothing
    q = torch.full_like(outputs, s / (outputs.shape[1] - 1))
    q.scatter_(1, targets[:, None], 1 - s)
    per_example = -(q * torch.log_softmax(outputs, dim=1)).sum(dim=1)
    value = per_example.mean() if spec.reduction == "mean" else per_example.sum()
    scale = network.l2_scale(spec, n_examples)
    if scale:
        value = value + scale * sum(m.weight.pow(2).sum() for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)))
    return value


def _decay_swapped(torch, spec, model, **impl):
    """torch.optim.AdamW where the spec says Adam with (coupled) weight decay, Adam's
    weight_decay where it says AdamW (decoupled)."""
    opt = spec.optimizer
    if opt.kind in ("adam", "adamw") and opt.weight_decay:
        other = torch.optim.Adam if opt.kind == "adamw" else torch.optim.AdamW
        return other(model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay, **impl)
    return torch_adapter._optimizer(torch, spec, model, **impl)


def _no_nesterov(torch, spec, model, **impl):
    """SGD's momentum without nesterov=True: the heavy ball where the spec says Nesterov."""
    opt = spec.optimizer
    if opt.kind == "sgd" and opt.nesterov:
        return torch.optim.SGD(model.parameters(), lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay, **impl)
    return torch_adapter._optimizer(torch, spec, model, **impl)


def _rmsprop_centered(torch, spec, model, **impl):
    """torch.optim.RMSprop with centered=True (the gradient's running mean taken out of v)
    where the spec says the uncentered form; the adapter's own translation otherwise."""
    centered = {"centered": True} if spec.optimizer.kind == "rmsprop" else {}
    return torch_adapter._optimizer(torch, spec, model, **impl, **centered)


def _has(doc: dict, section: str, key: str) -> bool:
    return bool(doc[section].get(key))


# name -> (the torch_adapter functions the copy gets instead of its own, which generated
# spec documents it changes the math of)
RECIPE_BUGS = {
    "torch_schedule_ahead": (
        {"_train_step": _train_step(schedule_first=True)},
        lambda doc: doc["optimizer"].get("schedule", {}).get("kind", "constant") != "constant",
    ),
    "torch_decay_swapped": (
        {"_optimizer": _decay_swapped},
        lambda doc: doc["optimizer"]["kind"] != "sgd" and _has(doc, "optimizer", "weight_decay"),
    ),
    "torch_clip_eps": ({"_train_step": _train_step(clip=_clip_eps)}, lambda doc: _has(doc, "optimizer", "clip_global_norm")),
    "torch_smoothing_over_others": ({"_train_step": _train_step(loss=_smoothing_over_others)}, lambda doc: _has(doc, "loss", "label_smoothing")),
    "torch_no_nesterov": ({"_optimizer": _no_nesterov}, lambda doc: _has(doc, "optimizer", "nesterov")),
    "torch_late_rate": ({"_train_step": _train_step(late=True)}, lambda doc: True),
    "torch_rmsprop_centered": ({"_optimizer": _rmsprop_centered}, lambda doc: doc["optimizer"]["kind"] == "rmsprop"),
}


def _jax_clip_per_leaf(opt):
    """optax's chain with each gradient leaf clipped by its own norm (max_norm / ||g_leaf||,
    at most 1) where the spec clips by the global norm."""
    import jax
    import jax.numpy as jnp
    import optax

    if opt.clip_global_norm is None:
        return jax_adapter.transformation(opt)
    unclipped = jax_adapter.transformation(opt.model_copy(update={"clip_global_norm": None}))
    limit = opt.clip_global_norm

    def clip(updates, params=None):
        return jax.tree.map(lambda g: g * jnp.minimum(1.0, limit / jnp.linalg.norm(g)), updates)

    return optax.chain(optax.stateless(clip), unclipped)


def _jax_decay_at_peak(opt):
    """AdamW written as optax.adam at the schedule plus a decay of peak lr * weight_decay * p:
    the decay at the peak rate where optax.adamw (and torch) decay at the scheduled one."""
    import jax
    import optax

    if opt.kind != "adamw" or not opt.weight_decay:
        return jax_adapter.transformation(opt)
    adam = jax_adapter.transformation(opt.model_copy(update={"kind": "adam", "weight_decay": 0.0}))
    shrink = opt.lr * opt.weight_decay

    def decay(updates, params):
        return jax.tree.map(lambda u, p: u - shrink * p, updates, params)

    return optax.chain(adam, optax.stateless(decay))


def rmsprop_alias(optax, lr, opt, **options):
    """optax.rmsprop with the spec's decay, eps and momentum, and its other defaults (eps
    inside the square root, the rate before the momentum trace) unless `options` set them:
    RMSprop as a port that takes optax's alias writes it, in jax_adapter.OPTIMIZERS's place
    (the recipe around it, clipping and a coupled decay, stays the adapter's)."""
    return optax.rmsprop(lr, decay=opt.alpha, eps=opt.eps, momentum=opt.momentum or None, **options)


def _scheduled(doc: dict) -> bool:
    return doc["optimizer"].get("schedule", {}).get("kind", "constant") != "constant"


# name -> (the jax_adapter functions the copy gets instead of its own, which generated spec
# documents it changes the math of)
JAX_RECIPE_BUGS = {
    "jax_clip_per_leaf": ({"transformation": _jax_clip_per_leaf}, lambda doc: _has(doc, "optimizer", "clip_global_norm")),
    "jax_decay_at_peak": (
        {"transformation": _jax_decay_at_peak},
        lambda doc: doc["optimizer"]["kind"] == "adamw" and _has(doc, "optimizer", "weight_decay") and _scheduled(doc),
    ),
    "jax_rmsprop_alias": ({"OPTIMIZERS": {**jax_adapter.OPTIMIZERS, "rmsprop": rmsprop_alias}}, lambda doc: doc["optimizer"]["kind"] == "rmsprop"),
}
