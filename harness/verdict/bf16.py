"""Where a bf16 run computes in bfloat16 (issue 86): each framework's way in words, and the
layers and loss a run computes in bfloat16 where torch's autocast run (the bf16 envelope's
own) keeps float32, read from what each run recorded (its math_mode's `computed_in`,
adapters/protocol.py RecordsComputedIn). A failing bf16 check's diagnosis names them: a loss,
or a sum that torch promotes to float32, taken in bfloat16, or parameters held in bfloat16
(flax's param_dtype) where autocast keeps them float32, is a bf16-only bug."""

from __future__ import annotations

from harness.core.registry import BF16, BF16_MEMBER_KEY, RunKey

# Where each framework's bf16 run computes in bfloat16 (adapters/torch_adapter.py, jax_layers.py)
WHERE = {
    "torch": "torch.autocast's lists on the CPU: linear, conv and matmul in bfloat16, the loss and embeddings in float32",
    "jax": "flax's modules in dtype=bfloat16 where autocast computes bfloat16, the loss on float32 logits; "
    "XLA:CPU sums a bias's gradient over several axes in bfloat16 where torch sums in float32 (tests/test_bf16.py); "
    "flax's attention takes its scores and softmax in bfloat16 where torch's fused CPU kernel keeps float32",
    "numpy": "float32 values rounded to bfloat16 (ml_dtypes) where torch's autocast on the CPU computes in bfloat16 (harness/reference/autocast.py)",
    "cupy": "float32 values rounded to bfloat16 where torch's autocast on the CPU computes in bfloat16 (harness/reference/autocast.py)",
}


def computed_in(outcome) -> dict[str, str]:
    """The dtype of each layer's output and of the loss that a bf16 run recorded ({} if none)."""
    return ((outcome.describe.get("math_mode") or {}).get("computed_in") or {}) if outcome is not None else {}


def apart(outcomes: dict) -> dict[RunKey, list[str]]:
    """Each bf16 run's layers (and "loss", and "parameters") computed in bfloat16 where
    torch's autocast run keeps float32; runs with none are left out."""
    kept = computed_in(outcomes.get(BF16_MEMBER_KEY))
    found = {}
    for key, outcome in outcomes.items():
        if key.precision == BF16 and key.framework != BF16_MEMBER_KEY.framework:
            names = [name for name, dtype in computed_in(outcome).items() if dtype == "bfloat16" and kept.get(name) == "float32"]
            if names:
                found[key] = names
    return found
