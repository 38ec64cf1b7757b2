"""A library's catalogued formula (harness/known_differences.yaml, `formula`) applied to a
problem: what the oracle computes as that library's float64 reference."""

from __future__ import annotations

from dataclasses import replace

from harness.inputs.problem import Problem


def library_problem(problem: Problem, formula) -> Problem:
    """The problem as a library computes it where its formula differs from the spec's and
    the oracle can compute the library's exactly (harness/known_differences.yaml,
    `formula`): its clipping eps, its SGD dampening, the variance its batch norm stores,
    its schedule's rates, its float32 bias corrections. The oracle on it is the reference
    of that library's float64 twin. A port's reference, torch's own run, computes all but
    the sequential loss sum (roles.PORT_SCHEME)."""
    doc = problem.spec.model_dump()
    if formula.dampening is not None and "dampening" in doc["optimizer"] and doc["optimizer"].get("momentum"):
        doc["optimizer"]["dampening"] = formula.dampening
    if formula.running_var is not None and problem.port is None:
        for layer in doc["model"]["layers"]:
            if layer.get("kind") == "batch_norm":
                layer["running_var"] = formula.running_var
    spec = type(problem.spec).model_validate(doc)
    rates = formula.rates if isinstance(formula.rates, tuple) else None
    if formula.rates is not None and rates is None:
        raise ValueError(f"library_problem: the rates of {formula.rates!r} were not computed (harness/calibrate/roles.py resolved)")
    computed = {"spec": spec, "rates": rates, "float32_corrections": formula.bias_corrections == "float32"}
    if problem.port is not None:
        # a port's torch reference or member (roles.PORT_SCHEME): torch.optim with the library's
        # dampening, rates and bias corrections, torch's clipping turned to the library's eps
        # (adapters/torch_adapter.py), the variance its batch norms store and how they and its
        # layer norms compute theirs (adapters/torch_port.py)
        fast = {"port_fast_variance": formula.variance == "fast", "port_layer_norm_fast": formula.layer_norm_variance == "fast"}
        return replace(problem, **computed, port_running_var=formula.running_var, port_clip_eps=formula.clip_eps, **fast)
    return replace(problem, **computed, clip_eps=formula.clip_eps or 0.0, sequential_loss=formula.loss_sum == "sequential")
