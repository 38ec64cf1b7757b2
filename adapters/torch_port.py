"""A user's torch module (a port, harness/inputs/port.py) as the torch adapter's network:
the same trainer, optimizer, loss and data feeding as a spec of layers, only the module is
the user's. Its tensors are named and laid out as its state_dict() has them (its floating
tensors), which is the port's layout everywhere in the harness."""

from __future__ import annotations

import numpy as np

from harness.inputs import port


def network(torch, problem, params: dict[str, np.ndarray], device: str, dtype):
    """The user's module holding `params` (by state_dict name), wrapped to take the
    adapter's call `model(x, masks, outputs=None)`: x flat as the data has it (an image
    made NCHW), masks ignored (a port has no harness dropout), and with `outputs`, every
    named submodule's tensor output by module name (forward hooks) and the whole module's
    output as `output` (a module path written as flax writes it: "block/conv" for torch's
    "block.conv")."""
    shape = problem.spec.model.in_shape

    class Port(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, masks, outputs=None):
            x = x.reshape((x.shape[0], *shape))
            if outputs is None:
                return port.call(problem.port, "the torch module's forward", self.inner, x)
            hooks = [m.register_forward_hook(_keeper(outputs, name.replace(".", "/"))) for name, m in self.inner.named_modules() if name]
            try:
                out = port.call(problem.port, "the torch module's forward", self.inner, x)
            finally:
                for hook in hooks:
                    hook.remove()
            outputs["output"] = out
            return out

    inner = port.torch_module(problem.port, problem.spec.init.seed).to(device=device, dtype=dtype)
    state = inner.state_dict()
    missing = sorted(set(params) - set(state))
    if missing:
        raise port.PortError(f"{problem.port}: torch_model() has no tensor {missing[0]}")
    with torch.no_grad():
        for name, value in params.items():
            if name in state:
                state[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))
    return Port(inner).train()


def _keeper(outputs: dict, name: str):
    def keep(module, inputs, output):
        if hasattr(output, "is_floating_point") and output.is_floating_point():
            outputs[name] = output

    return keep


def tensors(model) -> dict[str, np.ndarray]:
    """Every floating tensor of the user's module by its state_dict name, as NumPy (its own dtype)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.inner.state_dict().items() if v.is_floating_point()}


def trained(model) -> list[tuple[str, object]]:
    """The trained tensors (named_parameters), in the optimizer's order."""
    return list(model.inner.named_parameters())
