# A port checked from a test file: `python -m pytest examples/test_port_example.py`.
import flax.linen as nn
import jax
import numpy as np
import torch

import harness
from harness.testing import assert_port_matches, harness_processes  # noqa: F401 (workers held across the checks)


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


class FlaxMLP(nn.Module):
    epsilon: float = 1e-5  # torch's LayerNorm epsilon; flax's default is 1e-6

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.LayerNorm(epsilon=self.epsilon, name="norm")(nn.Dense(32, name="fc1")(x))
        return nn.Dense(3, name="fc2")(jax.nn.gelu(x, approximate=False))  # torch's exact GELU


def torch_model():
    return TorchMLP()


def flax_model():
    return FlaxMLP()


def flax_model_with_flax_epsilon():  # the slip: flax's default epsilon left in
    return FlaxMLP(epsilon=1e-6)


def torch_to_flax(state):
    def dense(name):
        return {"kernel": state[f"{name}.weight"].T, "bias": state[f"{name}.bias"]}

    norm = {"scale": state["norm.weight"], "bias": state["norm.bias"]}
    return {"params": {"fc1": dense("fc1"), "norm": norm, "fc2": dense("fc2")}}


def blobs(n, seed):  # three classes of 8 float32 features, integer labels
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    return rng.normal(size=(n, 8)).astype(np.float32) + np.eye(3, 8, dtype=np.float32)[y] * 2, y


SETUP = dict(
    data={"train": blobs(256, 0), "validation": blobs(64, 1)},
    loss="cross_entropy",
    optimizer={"kind": "adam", "lr": 0.01},
    training={"epochs": 2, "batch_size": 32},
    checks={"math_parity": {"steps": 4, "members": 3}},
)


def test_the_honest_port_matches():
    assert_port_matches(torch_model, flax_model, torch_to_flax, **SETUP)  # AssertionError: the FAIL lines


def test_the_slip_is_different_math_in_the_norm():
    verdict = harness.check_port(torch_model, flax_model_with_flax_epsilon, torch_to_flax, **SETUP)
    assert not verdict.passed
    assert any(f.diagnosis == "implementation" and f.module == "norm" for f in verdict.failures), verdict
