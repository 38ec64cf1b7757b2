"""The generated family written as ports (issue 42): each drawn spec's network as a user's
torch module and flax module, made by the adapters' own translations of its layers
(adapters/torch_layers.py, adapters/jax_layers.py) behind the port interface, and run
through `model: {python: ...}`. An honest port must show no failing check.

A port takes what a spec of layers takes but dropout (each framework's own masks), an L2
penalty and label smoothing: such draws are adapted (no penalty) or drawn again (dropout,
label smoothing, a batch norm storing the biased variance). Every optimizer and recipe is
kept as drawn: torch's reference and members compute the catalogued behaviours of optax
(its float32 Adam bias corrections and schedule, no dampening) and clip as optax does where
they stand for it (harness/calibrate/roles.py PORT_SCHEME)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

PORT = '''"""A generated port: the harness's translations of a spec's layers, as a user's modules."""

import json

import flax.linen as nn
import numpy as np
import torch

from adapters import jax_layers, torch_layers
from harness.layers import initial_tensors
from harness.spec.model import Spec

SPEC = Spec.model_validate(json.loads({doc!r}))


def _torch_net(dtype):
    return torch_layers.network(torch, SPEC, initial_tensors(SPEC.model.placed, SPEC.init), "cpu", dtype)


class TorchPort(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _torch_net(torch.float32)

    def forward(self, x):
        return self.net(x.reshape(x.shape[0], -1), {{}})


class FlaxPort(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
        if x.ndim == 4:
            x = x.transpose(0, 3, 1, 2)
        return jax_layers.module(SPEC)(x.reshape((x.shape[0], -1)), {{}}, train)


def torch_model():
    return TorchPort()


def flax_model():
    return FlaxPort()


def torch_to_flax(state):
    net = _torch_net(torch.float64)
    net.load_state_dict({{k.removeprefix("net."): torch.from_numpy(np.asarray(v)) for k, v in state.items()}}, strict=False)
    found = jax_layers.variables(SPEC, torch_layers.tensors(net, SPEC), "float64")
    return {{collection: {{"Network_0": tree}} for collection, tree in found.items()}}
'''


def portable(doc: dict) -> bool:
    """Whether a drawn spec can be a port once adapted (port_of)."""
    layers = doc["model"]["layers"]
    if any(layer.get("kind") == "dropout" or layer.get("running_var") == "biased" for layer in layers):
        return False
    return not doc["loss"].get("label_smoothing")


def port_of(doc: dict, folder: Path) -> Path:
    """The spec `doc` written as a port in `folder` (its network in port.py, the spec naming
    it with the seed alone; no penalty); the spec's path."""
    (folder / "port.py").write_text(PORT.format(doc=json.dumps(doc)))
    model = {k: v for k, v in doc["model"].items() if k != "layers"}
    port = {**doc, "name": "generated_port", "model": {**model, "python": "port.py"}, "init": {"seed": doc["init"]["seed"]}}
    port["loss"] = {k: v for k, v in doc["loss"].items() if k != "l2"}
    path = folder / "generated_port.yaml"
    path.write_text(yaml.safe_dump(port, sort_keys=False))
    return path


def drawn(count: int, seed: int | None = None) -> list[dict]:
    """`count` drawn specs a port can take (tests/family.py spec_documents, kept where
    portable): derandomized (the slow test's), or from a hypothesis seed
    (tools/port_family.py)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st

    from tests import family

    docs: list[dict] = []

    @settings(
        max_examples=count, deadline=None, derandomize=seed is None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(st.data())
    def draw(data):
        for _ in range(100):
            doc = data.draw(family.spec_documents(), label="spec")
            if portable(doc):
                docs.append(doc)
                return

    (draw if seed is None else seeded(seed)(draw))()
    return docs
