"""torch's fast mode (adapters/torch_adapter.py, mode "fast"): on the CPU, forward and loss
as one torch.compile graph per batch size with the fused optimizer; on the GPU, whole steps
captured as CUDA graphs (torch.cuda.graphs), one per batch size, that find their batch and
their loss-log slot through device-side counters, with no host in the loop."""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapters import torch_layers


@dataclass
class Fast:
    """The fast mode's state besides the model and the optimizer."""

    objective: tuple  # (kind, reduction, l2 scale or 0): plain values the compiled graph guards on
    sizes: list[int]  # the batch size of each step of an epoch
    initial: dict[str, Any]  # the model's state (parameters and buffers) at build, for warm_up to restore
    step_counter: Any = None  # GPU: int64 [1], the next loss-log slot, advanced inside the graphs
    slots: Any = None  # GPU: arange(total_steps), to find the log slot of step_counter
    tables: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # GPU: size -> (batch rows, counter)
    graphs: dict[int, Any] = field(default_factory=dict)  # GPU: size -> CUDA graph
    next_step: int = 0  # the step the counters point at (host side: no sync to know it)


_COMPILED: dict[str, Any] = {}


def _compiled_objective(torch):
    """forward + loss as one torch.compile graph; AOTAutograd compiles its backward as another.
    Module-level, with the model an argument: dynamo guards on the model's structure and the
    tensors' shapes, not on the objects, so every trainer of a spec reuses the compiled graphs.
    Static shapes: each batch size is its own graph, all compiled in warm_up."""
    if "objective" not in _COMPILED:

        def forward_loss(model, x, y, rows, masks, kind, reduction, scale):
            if rows is not None:  # the batch's gather, fused into the graph
                x, y = x[rows], y[rows]
            # a port: the user's own module, compiled as it is (adapters/torch_port.py plain)
            out = model.plain(x) if hasattr(model, "plain") else model(x, masks)
            return torch_layers.objective(torch, kind, reduction, scale, model, out, y)

        _COMPILED["objective"] = torch.compile(forward_loss, dynamic=False, fullgraph=True, **_recompile_limit(torch))
    return _COMPILED["objective"]


# One graph per batch size (a last partial batch is a second shape) and per spec in the
# process: more than dynamo's default limit of 8 recompiles of one function.
RECOMPILE_LIMIT = 64


def _recompile_limit(torch) -> dict[str, int]:
    """torch.compile's own `recompile_limit` keyword where this torch has it (it arrived
    after 2.11, which raises TypeError on it); else dynamo's process-wide limit, raised."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return {"recompile_limit": RECOMPILE_LIMIT}
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    return {}


def _cpu_step(torch, trainer, t: int) -> None:
    problem, data = trainer.problem, trainer.data
    rows = None
    if problem.batch_order is not None:
        epoch, start, stop = problem.batch_slice(t)
        rows = data["order"][epoch, start:stop]
    masks = problem.step_masks(data, t)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss = _compiled_objective(torch)(trainer.model, data["x"], data["y"], rows, masks, *trainer.fast.objective)
    loss.backward()
    trainer.optimizer.step()
    trainer.loss_log[t] = loss.detach()


def gpu_tables(torch, trainer) -> None:
    """The device-side counters, and for a batch order one table of batch rows per batch size
    (row k: the k-th batch of that size), so a graph finds its batch with no host in the loop."""
    problem, fast = trainer.problem, trainer.fast
    dev = trainer.loss_log.device
    fast.step_counter = torch.zeros(1, dtype=torch.int64, device=dev)
    fast.slots = torch.arange(problem.total_steps, device=dev)
    if problem.batch_order is None:
        return
    for size in sorted(set(fast.sizes)):
        rows = [epoch[a:b] for epoch in problem.batch_order for a, b in problem.bounds if b - a == size]
        table = torch.from_numpy(np.ascontiguousarray(np.stack(rows))).to(dev)
        fast.tables[size] = (table, torch.zeros(1, dtype=torch.int64, device=dev))


def gpu_step(torch, trainer, size: int) -> None:
    """One whole step, written to be captured: everything on the device, no host reads."""
    fast = trainer.fast
    x, y = trainer.data["x"], trainer.data["y"]
    if size in fast.tables:
        table, counter = fast.tables[size]
        rows = table.index_select(0, counter).view(-1)
        x, y = x.index_select(0, rows), y.index_select(0, rows)
        counter.add_(1)
    trainer.optimizer.zero_grad(set_to_none=True)  # captured: backward writes the graph's own grads
    loss = torch_layers.objective(torch, *fast.objective, trainer.model, trainer.model(x, {}), y)
    loss.backward()
    trainer.optimizer.step()
    # The log slot by an elementwise select, not index_copy_: under deterministic algorithms
    # index_copy_ on CUDA becomes a sorting index_put_; this is one plain kernel, surely
    # capturable, and the exact float32 loss lands in its slot.
    log = trainer.loss_log
    torch.where(fast.slots == fast.step_counter, loss.detach(), log, out=log)
    fast.step_counter.add_(1)


def _capture(torch, trainer, sizes) -> None:
    """torch.cuda.graphs' whole-network capture: warm-up steps on a side stream (lazy optimizer
    state, cuBLAS handles), then one graph per batch size."""
    fast = trainer.fast
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
        for size in sizes:
            for _ in range(3):
                seek(trainer, 0)  # keeps the counters inside the tables and the log
                gpu_step(torch, trainer, size)
    torch.cuda.current_stream().wait_stream(side)
    for size in sizes:
        seek(trainer, 0)
        trainer.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gpu_step(torch, trainer, size)
        fast.graphs[size] = graph


def warm_up(torch, trainer, plan) -> None:
    sizes = trainer.problem.first_step_of_each_size(plan)
    if trainer.device == "gpu":
        _capture(torch, trainer, sizes)
    else:
        for t in sizes.values():
            for _ in range(2):  # anything a repeated call would recompile, it does here
                _cpu_step(torch, trainer, t)
    _restore(torch, trainer)
    if trainer.device == "gpu":
        torch.cuda.synchronize()


def _restore(torch, trainer) -> None:
    """The state at build, written into the same tensors (a captured graph or a compiled one
    holds them): parameters, optimizer state (Adam: step, exp_avg, exp_avg_sq all start at
    zero; SGD keeps none), gradients, loss log and counters."""
    fast = trainer.fast
    with torch.no_grad():
        now = trainer.model.state_dict()
        for name, initial in fast.initial.items():
            now[name].copy_(initial)
        for state in trainer.optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.zero_()
        if trainer.device == "gpu":
            for p in trainer.model.parameters():
                if p.grad is not None:
                    p.grad.zero_()  # the graphs own these buffers: keep them
        else:
            trainer.optimizer.zero_grad(set_to_none=True)  # as built: no gradients yet
        trainer.loss_log.zero_()
    seek(trainer, 0)


def seek(trainer, start: int) -> None:
    """Point the device-side counters at step `start` (host arithmetic, device writes: no sync)."""
    fast = trainer.fast
    if fast.step_counter is not None:
        fast.step_counter.fill_(start)
        epochs, within = divmod(start, len(fast.sizes))
        for size, (_, counter) in fast.tables.items():
            counter.fill_(epochs * fast.sizes.count(size) + fast.sizes[:within].count(size))
    fast.next_step = start


def train(torch, trainer, start: int, stop: int) -> None:
    fast = trainer.fast
    if start != fast.next_step:
        seek(trainer, start)
    if trainer.device == "gpu":
        for t in range(start, stop):
            graph = fast.graphs.get(trainer.problem.batch_size(t))
            if graph is None:
                raise RuntimeError(f"no CUDA graph for step {t}'s batch size: warm_up(trainer, plan) captures them")
            graph.replay()
    else:
        for t in range(start, stop):
            _cpu_step(torch, trainer, t)
    fast.next_step = stop
