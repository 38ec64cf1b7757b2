"""A generated family of workloads: hypothesis builds whole valid specs, each runs through
every installed adapter in float32 and float64 against the oracle, with one injected bug.

An honest adapter must show no failing check on any example (a false alarm is a bug in the
rule, not in the example), and every injected bug must be diagnosed `implementation`.
`nox -s family` runs many examples and summarises them (`python -m tests.family FILE`);
`nox -s tests` runs a few (tests/test_family.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import strategies as st
from rich.console import Console

from harness.calibrate.spread import tensors
from harness.core import registry
from harness.core.registry import DIVERGENCE_CHECKS, FLOAT64, ORACLE_KEY, RunKey
from harness.inputs import problem as inputs
from harness.matrix import SpecResult
from harness.reference import network
from harness.spec.load import LoadedSpec, validate_document
from harness.spec.model import total_steps

REAL = tuple(f for f in registry.ADAPTERS if registry.runs_on(f, "cpu"))  # the honest adapters
# The injected bugs (tests/test_injected_bugs.py) that change the math of a given spec.
BUGS_FOR_ANY = ("torch_matmul_bfloat16", "torch_loss_scaled")


ACTIVATIONS = ["relu", "tanh", "identity", "gelu", "gelu_tanh"]


def _fits(shape, layers: list[dict]) -> bool:
    from harness.layers import place
    from harness.spec.model import ModelSection

    try:
        place(ModelSection.model_validate({"input_shape": list(shape), "layers": [*layers, {"kind": "flatten"}, {"width": 2}]}).layers, shape)
    except ValueError:
        return False
    return True


@st.composite
def image_layers(draw, shape: tuple[int, int, int], classes: int) -> list[dict]:
    """1-2 convolutions (valid, same or explicit padding, stride 1-2, any activation), each
    maybe followed by batch norm and a pooling; a flatten; maybe a hidden dense layer, layer
    norm and dropout; the output layer."""
    layers: list[dict] = []
    for _ in range(draw(st.integers(1, 2))):
        padding = draw(st.sampled_from(["valid", "same", "explicit"]))
        if padding == "explicit":
            padding = [[draw(st.integers(0, 2)), draw(st.integers(0, 2))], [draw(st.integers(0, 2)), draw(st.integers(0, 2))]]
        conv = {
            "kind": "conv2d",
            "filters": draw(st.integers(1, 4)),
            "kernel": draw(st.integers(1, 3)),
            "stride": draw(st.integers(1, 2)),
            "padding": padding,
            "activation": draw(st.sampled_from(ACTIVATIONS)),
        }
        if not _fits(shape, [*layers, conv]):
            continue
        layers.append(conv)
        if draw(st.booleans()):
            norm = {"kind": "batch_norm", "momentum": draw(st.sampled_from([0.01, 0.1, 0.5])), "eps": draw(st.sampled_from([1e-5, 1e-3]))}
            layers.append({**norm, "running_var": draw(st.sampled_from(["unbiased", "biased"]))})
        if draw(st.booleans()):
            pool = {"kind": draw(st.sampled_from(["max_pool", "avg_pool"])), "window": 2, "stride": draw(st.sampled_from([1, 2]))}
            if _fits(shape, [*layers, pool]):
                layers.append(pool)
    if not layers:  # nothing fitted: a 1x1 convolution always does
        layers.append({"kind": "conv2d", "filters": 2, "kernel": 1, "activation": draw(st.sampled_from(ACTIVATIONS))})
    layers.append({"kind": "flatten"})
    if draw(st.booleans()):
        layers.append({"width": draw(st.integers(2, 16)), "activation": draw(st.sampled_from(ACTIVATIONS))})
        if draw(st.booleans()):
            layers.append({"kind": "layer_norm", "eps": draw(st.sampled_from([1e-6, 1e-5, 1e-3]))})
    if draw(st.booleans()):
        layers.append({"kind": "dropout", "rate": draw(st.sampled_from([0.1, 0.25, 0.5]))})
    layers.append({"width": classes})
    return layers


# A recipe workload's math-parity segment: the first steps' twins, and re-anchored twins
# every as many steps after them.
RECIPE_SEGMENT = 30


@st.composite
def recipe_optimizer(draw, plain: dict) -> dict:
    """The plain optimizer with a training recipe (harness/optimizers/): SGD with
    momentum (Nesterov or dampening), Adam, AdamW or RMSprop (with or without momentum, at
    Adam's rate), weight decay, clipping (often tight
    enough to fire), and a schedule (its shape drawn once the run's length is known)."""
    opt = dict(plain)
    if opt["kind"] == "sgd":
        momentum = draw(st.sampled_from([0.0, 0.5, 0.9]))
        if momentum:
            opt["momentum"] = momentum
            if draw(st.booleans()):
                opt["nesterov"] = True
            elif draw(st.booleans()):
                opt["dampening"] = draw(st.sampled_from([0.1, 0.5]))
    elif draw(st.booleans()):
        opt["kind"] = "adamw"
        opt["weight_decay"] = draw(st.sampled_from([1e-4, 1e-2, 0.1]))
    elif draw(st.booleans()):
        opt = {"kind": "rmsprop", "lr": opt["lr"], "alpha": draw(st.sampled_from([0.9, 0.99])), "eps": opt["eps"]}
        if draw(st.booleans()):
            opt["momentum"] = draw(st.sampled_from([0.5, 0.9]))
    if opt["kind"] != "adamw" and draw(st.booleans()):
        opt["weight_decay"] = draw(st.sampled_from([1e-4, 1e-3, 1e-2]))
    if draw(st.booleans()):
        opt["clip_global_norm"] = draw(st.sampled_from([0.05, 0.2, 1.0, 5.0]))
    if draw(st.booleans()):
        opt["schedule"] = {}
    return opt


@st.composite
def schedule(draw, total: int) -> dict:
    kind = draw(st.sampled_from(["constant", "step", "warmup_cosine"]))
    if kind == "step":
        return {"kind": "step", "every": draw(st.integers(5, 40)), "gamma": draw(st.sampled_from([0.5, 0.8, 0.95]))}
    if kind == "warmup_cosine":
        warmup = draw(st.integers(0, 20))
        return {
            "kind": "warmup_cosine",
            "warmup_steps": warmup,
            "decay_steps": draw(st.integers(warmup + 10, total + 20)),
            "init_fraction": draw(st.sampled_from([0.0, 0.1])),
            "end_fraction": draw(st.sampled_from([0.0, 0.01, 0.1])),
        }
    return {"kind": "constant"}


# The texts a text workload trains on: small licences Debian's base-files ships, so that an
# epoch is a few dozen steps.
TEXT_DIR = Path("/usr/share/common-licenses")
TEXTS = ("BSD", "Artistic", "CC0-1.0")
KINDS = ("mlp", "image", "recipe")  # the kinds spec_documents draws by default; and "text"


@functools.cache
def _sha256(name: str) -> str:
    return hashlib.sha256((TEXT_DIR / name).read_bytes()).hexdigest()


@st.composite
def _whole(draw, data: dict, model: dict, loss: dict, optimizer: dict, training: dict, per_epoch: int, steps: int, recipe: bool) -> dict:
    """The spec of a drawn workload: epochs for `steps` updates (whole epochs of
    `per_epoch`), a recipe's schedule over them and its re-anchored segments, and the
    initial weights drawn."""
    training["epochs"] = max(1, -(-steps // per_epoch))
    if recipe and "schedule" in optimizer:
        optimizer["schedule"] = draw(schedule(training["epochs"] * per_epoch))
    checks = {"params_after_steps": {"step": min(10, training["epochs"] * per_epoch)}}
    if recipe:
        checks["math_parity"] = {"steps": RECIPE_SEGMENT, "every": RECIPE_SEGMENT}
    return {
        "name": "generated",
        "title": "a generated workload",
        "article": "tests/family.py",
        "data": data,
        "model": model,
        "init": {
            "weights": draw(st.sampled_from(["glorot_uniform", "normal_over_sqrt_fan_in", "torch_linear_default"])),
            "biases": draw(st.sampled_from(["zeros", "torch_linear_default"])),
            "seed": draw(st.integers(0, 999)),
        },
        "loss": loss,
        "optimizer": optimizer,
        "training": training,
        "logging": {"loss_every": 1, "print_every": 1000},
        "checks": checks,
        "timing": {"repeats": 1},
    }


@st.composite
def text_block(draw, width: int, heads: int, causal: bool, rope: dict | None, bias: bool) -> list[dict]:
    """One transformer block: attention and a feed-forward, each maybe inside a residual,
    each maybe after a layer norm (pre-norm), the feed-forward maybe with dropout."""
    attention = {"kind": "attention", "heads": heads, "causal": causal, "bias": bias, **({"rope": rope} if rope else {})}
    hidden = width * draw(st.integers(1, 4))
    feed = [{"kind": "dense", "width": hidden, "activation": draw(st.sampled_from(["gelu", "gelu_tanh", "relu", "tanh"]))}]
    if draw(st.booleans()):
        feed.append({"kind": "dropout", "rate": draw(st.sampled_from([0.1, 0.25]))})
    feed.append({"kind": "dense", "width": width})
    found = []
    for body in ([attention], feed):
        if draw(st.integers(0, 3)):  # mostly pre-norm
            body = [{"kind": "layer_norm", "eps": draw(st.sampled_from([1e-6, 1e-5, 1e-3]))}, *body]
        found.extend([{"kind": "residual", "layers": body}] if draw(st.integers(0, 4)) else body)
    return found


@st.composite
def text_documents(draw) -> dict:
    """A small transformer on a real text's bytes (harness/layers/attention.py): 1-2 blocks
    of 1-3 heads of width 2-8, causal or not, learned positions or RoPE in either layout (or
    neither), biases or none, layer norms, GELU in both forms, dropout; a final layer norm
    maybe; SGD, Adam or a recipe (AdamW, RMSprop, momentum, schedules, clipping); batches
    of 2 to 32 examples, at least 20 to 60 steps, or 60 to 90 re-anchored along the run
    (a text's epoch may be longer: every example of it is seen once)."""
    file = draw(st.sampled_from(TEXTS))
    context = draw(st.integers(3, 12))
    examples = ((TEXT_DIR / file).stat().st_size - 1) // context
    validation = draw(st.integers(8, 32))
    heads, head_width = draw(st.integers(1, 3)), draw(st.sampled_from([2, 4, 6, 8]))
    width = heads * head_width
    where = draw(st.sampled_from(["positional", "half", "interleaved", "none"]))
    rope = {"layout": where, "base": draw(st.sampled_from([100, 10000]))} if where in ("half", "interleaved") else None
    causal, bias = draw(st.booleans()), draw(st.integers(0, 3)) > 0
    layers: list[dict] = [{"kind": "embedding", "width": width}]
    if where == "positional":
        layers.append({"kind": "positional", "max_len": context + draw(st.sampled_from([0, 0, 4]))})
    for _ in range(draw(st.integers(1, 2))):
        layers.extend(draw(text_block(width, heads, causal, rope, bias)))
    if draw(st.booleans()):
        layers.append({"kind": "layer_norm", "eps": 1e-5})
    layers.append({"kind": "dense", "width": 256})
    recipe = draw(st.integers(0, 3)) == 0
    reduction = draw(st.sampled_from(["mean", "mean", "sum"]))
    loss = {"kind": "cross_entropy", "reduction": reduction}
    if draw(st.integers(0, 3)) == 0:
        loss["label_smoothing"] = draw(st.sampled_from([0.05, 0.1]))
    steps = draw(st.integers(60, 90) if recipe else st.integers(20, 60))
    batch = max(draw(st.integers(2, 32)), -(-(examples - validation) // (90 if recipe else 60)))  # an epoch of 90 steps at most
    per_position = 1.0 if reduction == "mean" else 1.0 / (batch * context)
    if draw(st.booleans()):
        optimizer = {
            "kind": "adam",
            "lr": draw(st.sampled_from([1e-3, 3e-3, 1e-2])),
            "beta1": 0.9,
            "beta2": draw(st.sampled_from([0.99, 0.999])),
            "eps": draw(st.sampled_from([1e-8, 1e-7])),
        }
    else:
        optimizer = {"kind": "sgd", "lr": draw(st.sampled_from([0.1, 0.3, 1.0])) * per_position}
    if recipe:
        optimizer = draw(recipe_optimizer(optimizer))
    training = {"epochs": 1, "batch_size": batch, "shuffle": draw(st.booleans()), "shuffle_seed": draw(st.integers(0, 99)), "last_batch": "drop"}
    from harness.spec.model import TrainingSection

    per_epoch = total_steps(TrainingSection.model_validate(training), examples - validation)
    data = {"kind": "text", "file": file, "sha256": _sha256(file), "tokens": "bytes", "context": context, "validation": validation}
    data["split_seed"] = draw(st.integers(0, 99))
    return draw(_whole(data, {"layers": layers}, loss, optimizer, training, per_epoch, steps, recipe))


@st.composite
def spec_documents(draw, kinds: tuple[str, ...] = KINDS) -> dict:
    """A whole valid spec: half of them MLPs (depth 1 to 3, any widths, relu or tanh, mse
    (peaks) or cross-entropy (moons)), half small-image networks (1-3 channels, 6-12
    pixels, image_layers); mean or sum, L2 on or off, SGD or Adam with sane settings, full
    or mini batches with shuffling and both last-batch rules, 20 to 60 steps. With "text"
    among `kinds`, small transformers on real text too (text_documents)."""
    kind = draw(st.sampled_from(kinds))
    if kind == "text":
        return draw(text_documents())
    images, recipe = kind == "image", kind == "recipe"
    if images:
        shape = (draw(st.integers(1, 3)), draw(st.integers(6, 12)), draw(st.integers(6, 12)))
        classes = draw(st.integers(2, 4))
        n = draw(st.integers(40, 200))
        seed = draw(st.integers(0, 99))
        data = {
            "kind": "image_patterns",
            "n_samples": n,
            "shape": list(shape),
            "classes": classes,
            "noise": draw(st.sampled_from([0.3, 1.0])),
            "seed": seed,
        }
        loss_kind, outputs = "cross_entropy", classes
    elif draw(st.booleans()):
        side = draw(st.integers(5, 24))
        data = {"kind": "peaks_grid", "points_per_axis": side, "low": -3.0, "high": 3.0}
        n, loss_kind, outputs = side * side, "mse", 1
    else:
        n = draw(st.integers(40, 500))
        data = {"kind": "moons", "n_samples": n, "noise": draw(st.sampled_from([0.05, 0.1, 0.2, 0.3])), "seed": draw(st.integers(0, 99))}
        loss_kind, outputs = "cross_entropy", 2
    if images:
        layers = draw(image_layers(shape, classes))
        model = {"input_shape": list(shape), "layers": layers}
    else:
        hidden = draw(st.lists(st.integers(1, 32), min_size=1, max_size=3))
        activation = st.sampled_from(["relu", "tanh"])
        layers = [{"width": w, "activation": draw(activation)} for w in hidden] + [{"width": outputs, "activation": "identity"}]
        model = {"input_width": 2, "layers": layers}
    reduction = draw(st.sampled_from(["mean", "sum"]))
    loss = {"kind": loss_kind, "reduction": reduction}
    if recipe and loss_kind == "cross_entropy" and draw(st.booleans()):
        loss["label_smoothing"] = draw(st.sampled_from([0.05, 0.1, 0.2]))
    if draw(st.booleans()):
        loss["l2"] = {"coefficient": draw(st.sampled_from([1e-4, 1e-3, 1e-2])), "divide_by_examples": draw(st.booleans())}
    full = draw(st.booleans())
    batch = n if full else draw(st.integers(max(2, -(-n // 12)), max(2, n // 2)))
    # A summed loss grows with the batch: scale the rate so a step stays the same size.
    per_example = 1.0 if reduction == "mean" else 1.0 / batch
    if draw(st.booleans()):
        optimizer = {
            "kind": "adam",
            "lr": draw(st.sampled_from([1e-3, 3e-3, 1e-2, 3e-2])),
            "beta1": draw(st.sampled_from([0.8, 0.9])),
            "beta2": draw(st.sampled_from([0.99, 0.999])),
            "eps": draw(st.sampled_from([1e-8, 1e-7])),
        }
    else:
        optimizer = {"kind": "sgd", "lr": draw(st.sampled_from([0.01, 0.05, 0.1])) * per_example}
    if recipe:
        optimizer = draw(recipe_optimizer(optimizer))
    training = {
        "epochs": 1,
        "batch_size": "full" if full else batch,
        "shuffle": draw(st.booleans()),
        "shuffle_seed": draw(st.integers(0, 99)),
        "last_batch": draw(st.sampled_from(["keep", "drop"])),
    }
    from harness.spec.model import TrainingSection

    per_epoch = total_steps(TrainingSection.model_validate(training), n)
    # A recipe runs long enough for its schedule and clipping to act, and for segments of
    # re-anchored math parity after the first steps'.
    steps = draw(st.integers(90, 150) if recipe else st.integers(20, 60))
    return draw(_whole(data, model, loss, optimizer, training, per_epoch, steps, recipe))


def bugs_for(doc: dict) -> list[str]:
    """The injected bugs that change this spec's math: for a network with other layers than
    dense, the porting bugs of its layer kinds and activations (tests/layer_bugs.py)."""
    from tests.layer_bugs import JAX_LAYER_BUGS, LAYER_BUGS, TEXT_BUG_APPLIES
    from tests.recipe_bugs import JAX_RECIPE_BUGS, RECIPE_BUGS

    if doc["data"]["kind"] == "text":  # a transformer's porting bugs, torch's and JAX's
        return [name for name, applies in TEXT_BUG_APPLIES.items() if applies(doc)]
    present = {layer.get("kind", "dense") for layer in doc["model"]["layers"]} | {layer.get("activation") for layer in doc["model"]["layers"]}
    if present - {"dense", None, "relu", "tanh", "identity"}:
        return [name for name, (_, kinds) in {**LAYER_BUGS, **JAX_LAYER_BUGS}.items() if present & set(kinds)]
    if "math_parity" in doc["checks"]:  # a recipe workload: the bugs of its recipe
        return [name for name, (_, changes) in {**RECIPE_BUGS, **JAX_RECIPE_BUGS}.items() if changes(doc)]
    bugs = list(BUGS_FOR_ANY)
    if doc["loss"]["reduction"] == "mean":
        bugs.append("torch_loss_sum")
    if doc["optimizer"]["kind"] == "adam":
        bugs.append("numpy_eps_inside")
    return bugs


def loaded(doc: dict) -> LoadedSpec:
    path = Path("<generated>")
    spec, overrides = validate_document(path, doc)
    sha = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return LoadedSpec(spec=spec, path=path, sha256=sha, profile="full", overrides=overrides)


def run_example(doc: dict, bug: str) -> SpecResult:
    """Every real adapter and one buggy copy, float32 and float64, in this process."""
    from tests.test_injected_bugs import run_with_copies

    data_dir = TEXT_DIR if doc["data"]["kind"] == "text" else None
    return run_with_copies(loaded(doc), [bug], problem=inputs.build_problem(loaded(doc), data_dir))


@dataclass
class Verdict:
    honest_failures: list[str]  # failing gating checks between honest runs: must be empty
    worst_honest_ratio: float  # the largest error/tolerance among honest calibrated checks
    worst_honest_check: str
    known: int  # honest checks covered by a known difference
    bug: str
    bug_caught: bool  # the buggy twin fails math parity
    # The bug left the float64 twin where the honest one is, to float64 rounding (1e-12
    # relative), on this workload (every ReLU of a layer dead, say: the bugged product is
    # multiplied by zero; a symmetric padding "swapped"): there was no math difference to catch.
    bug_inert: bool
    bug_diagnoses: list[str]  # the diagnosis of each failing float32 check of the buggy run
    ran: list[str]
    # A porting bug of a layer kind (tests/layer_bugs.py): the layers it lives in, and whether
    # the diagnoses of the buggy run's failing checks (float32 and its twin's) name one of them.
    bug_layers: list[str] = dataclasses.field(default_factory=list)
    bug_layer_named: bool | None = None
    # Where math parity first saw the bug: the segment re-anchored at this step (None: the
    # first steps' twin, or not seen).
    bug_segment: int | None = None
    # The oracle diverged (a non-finite loss): the workload trains to nothing in exact
    # arithmetic either, there is no reference to judge against, and no verdict (counted
    # apart; a bug that changes the dynamics may still train).
    diverged: bool = False


def bug_layers(result: SpecResult, bug: str) -> list[str]:
    """The layers a porting bug lives in: those of its kinds, or with its activation."""
    from tests.layer_bugs import JAX_LAYER_BUGS, JAX_TEXT_BUGS, LAYER_BUGS, TEXT_BUGS

    every = {**LAYER_BUGS, **JAX_LAYER_BUGS, **{name: (copy, (kind,)) for name, (copy, kind) in {**TEXT_BUGS, **JAX_TEXT_BUGS}.items()}}
    kinds = every[bug][1] if bug in every else ()
    return [p.name for p in result.loaded.spec.model.placed if p.module.KIND in kinds or p.activation in kinds]


def names_a_layer(diagnoses: list[str], layers: list[str]) -> bool:
    """Whether a diagnosis names one of `layers`: as the first layer to differ, or as the
    layer of the tensor whose ratio is largest."""
    return any(f"layer {name} " in d or f"in {name}." in d for d in diagnoses for name in layers)


def judge(result: SpecResult, bug: str) -> Verdict:
    from tests.test_injected_bugs import BUGGY  # the honest adapter each bug is a copy of

    honest = [c for c in result.checks if c.a.framework not in (bug,) and c.b.framework not in (bug,) and c.verdict != "skipped"]
    failing = [f"{c.a.label} vs {c.b.label}: {c.name} ({c.ratio:.3g}x; {c.diagnosis})" for c in honest if c.verdict == "fail"]
    judged = [c for c in honest if c.ratio is not None and c.verdict == "pass" and np.isfinite(c.ratio)]
    worst = max(judged, key=lambda c: c.ratio, default=None)
    twin = [c for c in result.checks if c.a == RunKey(bug, "cpu", precision=FLOAT64) and c.b == ORACLE_KEY]
    mine = [c for c in result.checks if c.involves(RunKey(bug, "cpu")) and c.verdict == "fail"]
    layers = bug_layers(result, bug)
    anchored = [c for c in twin if c.verdict == "fail" and c.segment is not None]
    first_steps = [c for c in twin if c.verdict == "fail" and c.segment is None]
    diagnosed = [c.diagnosis for c in (*mine, *twin) if c.verdict == "fail" and c.diagnosis]
    # runs that diverged no earlier than their members summing in other orders (rules.divergence_check):
    # they ran as far as rounding alone carries the training
    rounding_diverged = {c.a for c in result.checks if c.name in DIVERGENCE_CHECKS and c.verdict == "pass"}
    return Verdict(
        honest_failures=failing,
        worst_honest_ratio=0.0 if worst is None else float(worst.ratio),
        worst_honest_check="" if worst is None else f"{worst.a.label} vs {worst.b.label}: {worst.name}",
        known=sum(c.verdict == "known" for c in honest),
        bug=bug,
        bug_caught=any(c.verdict == "fail" for c in twin),  # math_divergence where the twin diverged
        bug_inert=_same_math(result, RunKey(bug, "cpu", precision=FLOAT64), RunKey(BUGGY[bug][0], "cpu", precision=FLOAT64))
        and _same_segments(result, bug, BUGGY[bug][0]),
        bug_diagnoses=[c.diagnosis for c in mine],
        ran=sorted(k.label for k, o in result.outcomes.items() if o.status == "ok" or k in rounding_diverged),
        bug_layers=layers,
        bug_layer_named=names_a_layer(diagnosed, layers) if layers and diagnosed else None,
        bug_segment=anchored[0].segment if anchored and not first_steps else None,
        diverged=result.outcomes.get(ORACLE_KEY) is not None and result.outcomes[ORACLE_KEY].diverged,
    )


ROUNDING = 1e-12  # float64 rounding over a twin's steps, relative (measured: 1e-16 to 1e-13)


def _close(x, y) -> bool:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return x.shape == y.shape and float(np.abs(x - y).max(initial=0.0)) <= ROUNDING * max(float(np.abs(y).max(initial=0.0)), 1e-300)


def _same_segments(result: SpecResult, bug: str, real: str) -> bool:
    """Whether the re-anchored runs of two frameworks have the same losses, to float64
    rounding (true where the spec has no segments)."""
    runs = result.calibration.anchored if result.calibration else {}
    one, two = runs.get((bug, "cpu")), runs.get((real, "cpu"))
    if one is None and two is None:
        return True
    if one is None or two is None or one.status != "ok" or two.status != "ok" or set(one.segments) != set(two.segments):
        return False
    return all(_close(one.segments[a], two.segments[a]) for a in one.segments)


def clipped_updates(doc: dict) -> int:
    """How many of the oracle's updates clipped the gradient (0 without clipping)."""
    spec = loaded(doc).spec
    if spec.optimizer.clip_global_norm is None:
        return 0
    problem = inputs.build_problem(loaded(doc), TEXT_DIR if doc["data"]["kind"] == "text" else None)
    adapter = registry.load("numpy")
    trainer = adapter.build(problem, adapter.put(problem, ORACLE_KEY), ORACLE_KEY)
    fired = 0
    for step in range(problem.total_steps):
        before = dict(trainer.params)
        x, y = problem.batch(trainer.data, step)
        _, grads, _ = network.loss_and_grads(
            np, trainer.placed, before, x, y, spec.loss, len(problem.x_train), network.Context(masks=problem.step_masks(trainer.data, step))
        )
        fired += float(np.sqrt(sum((g * g).sum() for g in grads.values()))) > spec.optimizer.clip_global_norm
        adapter.train(trainer, step, step + 1)
    return fired


def _same_math(result: SpecResult, a: RunKey, b: RunKey) -> bool:
    """Whether two float64 runs have the same losses, snapshots and final parameters, to
    float64 rounding."""
    one, two = result.outcomes.get(a), result.outcomes.get(b)
    if one is None or two is None or one.status != "ok" or two.status != "ok":
        return False
    if not _close(one.losses, two.losses) or set(one.snapshots) != set(two.snapshots):
        return False
    pairs = [(one.final_params, two.final_params), *((one.snapshots[s], two.snapshots[s]) for s in one.snapshots)]
    return all(_close(x, y) for p, q in pairs for x, y in zip(tensors(p), tensors(q)))


def summarize(path: Path) -> dict:
    """Counts and the distribution of the worst honest ratio, from the JSON lines `path` holds."""
    every = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in every if not r["verdict"].get("diverged")]
    ratios = np.array([r["verdict"]["worst_honest_ratio"] for r in rows])
    inert = [r for r in rows if r["verdict"].get("bug_inert") and not r["verdict"]["bug_caught"]]
    caught = [r for r in rows if r["verdict"]["bug_caught"]]
    diagnosed = [r for r in caught if all(d.startswith("implementation") for d in r["verdict"]["bug_diagnoses"])]
    return {
        "examples": len(rows),
        "oracle_diverged": len(every) - len(rows),  # no reference, no verdict: not counted above
        "honest_failing_checks": sum(len(r["verdict"]["honest_failures"]) for r in rows),
        "examples_with_honest_failures": sum(bool(r["verdict"]["honest_failures"]) for r in rows),
        "known_checks": sum(r["verdict"]["known"] for r in rows),
        "bugs_injected": len(rows),
        "bugs_inert": len(inert),  # changed no bit of the float64 twin: nothing to catch
        "bugs_caught_by_math_parity": len(caught),
        "bugs_diagnosed_implementation": len(diagnosed),
        "layer_bugs_caught": sum(r["verdict"].get("bug_layer_named") is not None for r in caught),
        "layer_bugs_with_the_layer_named": sum(bool(r["verdict"].get("bug_layer_named")) for r in caught),
        "image_workloads": sum("input_shape" in r["spec"]["model"] for r in rows),
        "text_workloads": sum(r["spec"]["data"]["kind"] == "text" for r in rows),
        "recipe_workloads": sum("math_parity" in r["spec"]["checks"] for r in rows),
        "recipe_bugs_caught_in_a_later_segment": sum(r["verdict"].get("bug_segment") is not None for r in caught),
        "workloads_that_clip": sum(bool(r.get("clipped_updates")) for r in rows),
        "worst_honest_ratio_quantiles": {q: float(np.quantile(ratios, q / 100)) for q in (50, 90, 99, 100)} if len(ratios) else {},
        "seconds": sum(r["seconds"] for r in rows),
    }


def run_row(doc: dict, bug: str) -> dict:
    """One example, run and judged: the JSON line `nox -s family` writes. Importable by an
    executor's worker (harness/execute/executors.py): the examples spread over processes or a
    Ray cluster, each in its own process with its buggy copies registered there."""
    start = time.perf_counter()
    result = run_example(doc, bug)
    verdict = judge(result, bug)
    seconds = time.perf_counter() - start
    return {"spec": doc, "bug": bug, "verdict": dataclasses.asdict(verdict), "seconds": seconds, "clipped_updates": clipped_updates(doc)}


def main(argv: list[str]) -> int:
    summary = summarize(Path(argv[0]))
    Console().print_json(json.dumps(summary))
    ok = (
        summary["honest_failing_checks"] == 0
        and summary["bugs_diagnosed_implementation"] == summary["bugs_injected"] - summary["bugs_inert"]
        and summary["layer_bugs_with_the_layer_named"] == summary["layer_bugs_caught"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
