"""Workload specs: YAML files parsed with a safe loader into frozen, validated objects.

A spec says everything framework-neutral about a workload: the data, the model, the
initialisation, the loss, the optimizer, the training schedule, what is logged, and the
tolerance of every check. Validation happens once, here; an error names the file and
the key path. A profile is a named set of overrides (fewer steps, fewer points) that is
merged into the document and validated by the same rules.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer, model_validator

from harness.core.strict import Strict
from harness.layers import LayerSection, Placed, place
from harness.optimizers import Optimizer
from harness.spec.data import MAX_CONTEXT, VOCABULARY, DataSection, token_input
from harness.spec.fields import (
    MAX_LAYERS,
    MAX_MEMBERS,
    MAX_PROBE,
    MAX_PROFILES,
    MAX_REPEATS,
    MAX_SWEEP_POINTS,
    Name,
    NonNegative,
    PositiveInt,
    Rate,
    Seed,
    StepCount,
)
from harness.spec.known import KnownDifference

FULL_PROFILE = "full"
BENCH_PROFILE = "bench"  # the profile `harness bench` runs by default

# --- model, init, loss, optimizer -----------------------------------------------------------


class Tokens(Strict):
    """A text's input: `context` token ids an example, each below `vocabulary`."""

    context: Annotated[int, Field(gt=0, le=MAX_CONTEXT)]
    vocabulary: PositiveInt


# A port's file (model.python): a Python file beside the spec or in a folder under it,
# named by a relative path of plain names (harness/spec/load.py checks the file itself).
PORT_FILE = r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}/){0,4}[A-Za-z_][A-Za-z0-9_]{0,99}\.py$"
# The qualified name of a port's function in its file (model.functions): top-level names,
# dotted for a class's (a static method or a class): nothing defined inside a function.
QUALNAME = r"^[A-Za-z_][A-Za-z0-9_]{0,99}(?:\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,4}$"
PortRole = Literal["torch_model", "flax_model", "torch_to_flax"]


class ModelSection(Strict):
    """A network: its input (`input_width` features, or an image `input_shape` [channels,
    height, width], the data's features in that order; or a text's token ids, `tokens`,
    which a text data section gives: a spec on text data writes neither) and its layers,
    each of a kind in the layer registry (harness/layers/; a layer without a kind is dense).

    Or a user's own port instead of layers: `python`, a file beside the spec defining
    torch_model(), flax_model() and torch_to_flax(state) (harness/inputs/port.py). Only
    `harness run` imports it; loading a spec checks the file is there and nothing more."""

    input_width: PositiveInt | None = None
    input_shape: Annotated[list[Annotated[int, Field(gt=0, le=4096)]], Field(min_length=3, max_length=3)] | None = None
    # Derived from the data (a Spec fills it in), so left out of a spec's dump: the dumps
    # and digests of the specs that have none stay as they were.
    tokens: Annotated[Tokens | None, Field(exclude=True)] = None
    layers: Annotated[list[LayerSection], Field(min_length=1, max_length=MAX_LAYERS)] | None = None
    python: Annotated[str, Field(pattern=PORT_FILE)] | None = None
    # The qualified names that play a port's roles in its file, where they are not the roles'
    # own names (harness.check_port's callables); left out of a dump where not given.
    functions: dict[PortRole, Annotated[str, Field(pattern=QUALNAME)]] | None = None
    # A port's layer options as its torch module shows them ("batch_norm.running_var=unbiased",
    # harness/inputs/port.py layer_options), set where `harness run` builds its problem: what
    # the library catalogue matches a port's entries on. Never in a spec file, nor in a dump.
    port_options: Annotated[tuple[str, ...], Field(exclude=True)] = ()

    @model_serializer(mode="wrap")
    def _dump(self, handler) -> dict[str, Any]:
        """The keys a spec gave: a spec of layers dumps as it did before ports existed (its
        digests unchanged), a port without `layers`."""
        dumped = handler(self)
        if isinstance(dumped, dict):
            for key in ("python", "layers", "functions"):
                if dumped.get(key) is None:
                    dumped.pop(key, None)
        return dumped

    @property
    def is_port(self) -> bool:
        return self.python is not None

    @model_validator(mode="after")
    def _fits(self) -> ModelSection:
        if (self.layers is None) == (self.python is None):
            raise ValueError("model: give layers (the spec's own network) or python (a port's file), one of them")
        given = [self.input_width, self.input_shape, self.tokens]
        if sum(g is not None for g in given) != 1:
            if self.tokens is not None:
                raise ValueError("model: a text's input is its token ids: give no input_width or input_shape")
            raise ValueError("model: give input_width (a vector) or input_shape (an image), one of them")
        if self.functions is not None and not self.is_port:
            raise ValueError("model.functions: a port's (model.python), naming its functions")
        if self.port_options and not self.is_port:
            raise ValueError("model.port_options: a port's, found by running it")
        if self.is_port:
            return self
        if self.tokens is not None and (self.layers[0].kind != "embedding" or any(p.section.kind == "embedding" for p in self.placed[1:])):
            raise ValueError("model.layers: a text's token ids go into an embedding, the first layer and the only one")
        placed = self.placed
        if self.tokens is not None:
            if len(placed[-1].out_shape) != 2:
                raise ValueError("model.layers: the last layer must give a value per position (put a dense layer last)")
        elif len(placed[-1].out_shape) != 1:
            raise ValueError("model.layers: the last layer must give a vector (put a flatten and a dense layer last)")
        if placed[-1].activation not in (None, "identity"):
            raise ValueError("model.layers: the last layer must be 'identity' (the loss applies softmax)")
        return self

    @property
    def in_shape(self) -> tuple[int, ...]:
        if self.tokens is not None:
            return (self.tokens.context,)
        return (self.input_width,) if self.input_width is not None else tuple(self.input_shape)

    @property
    def in_features(self) -> int:
        return math.prod(self.in_shape)

    @cached_property
    def placed(self) -> list[Placed]:
        """The layers placed on their shapes; none for a port (its layers are its own code)."""
        if self.layers is None:
            return []
        return place(self.layers, self.in_shape, self.tokens.vocabulary if self.tokens is not None else None)

    @property
    def n_outputs(self) -> int | None:
        """The last layer's width (at every position, for a text); None for a port, whose
        outputs are known only once its code runs."""
        return self.placed[-1].out_shape[-1] if self.placed else None

    @property
    def is_mlp(self) -> bool:
        """Dense layers only: the shape every fast mode and the MLP figures know."""
        return self.layers is not None and all(layer.kind == "dense" for layer in self.layers)


class InitSection(Strict):
    """The initial weights, drawn once in NumPy (harness/layers/base.py) from a
    RandomState(seed) and handed to every framework. weights: `glorot_uniform`
    U(-sqrt(6 / (fan_in + fan_out)), +sqrt(...)); `normal_over_sqrt_fan_in` N(0, 1) / sqrt(fan_in);
    `torch_linear_default` U(-1 / sqrt(fan_in), 1 / sqrt(fan_in)), as nn.Linear and nn.Conv2d
    draw it. biases: `zeros`, or `torch_linear_default` (the same bound as the weight's).
    A spec of layers requires `weights` and `biases` (null only in a port); a port
    (model.python) gives the seed alone: its torch module's own initialisers make the
    weights after torch.manual_seed(seed)."""

    weights: Literal["glorot_uniform", "normal_over_sqrt_fan_in", "torch_linear_default"] | None = None
    biases: Literal["zeros", "torch_linear_default"] | None = None
    seed: Seed


class L2Penalty(Strict):
    """lambda/2 * sum(W^2) over the weights (not biases), divided by N if normalized."""

    coefficient: Rate
    divide_by_examples: bool


class LossSection(Strict):
    """The loss. label_smoothing (cross_entropy): the targets are (1 - s) * one_hot + s / K
    over all K classes, as torch's cross_entropy(label_smoothing=s) and optax.smooth_labels
    take them."""

    kind: Literal["mse", "cross_entropy"]
    reduction: Literal["mean", "sum"]
    l2: L2Penalty | None = None
    label_smoothing: Annotated[float, Field(ge=0, lt=1)] = 0.0

    @model_validator(mode="after")
    def _smoothing(self) -> LossSection:
        if self.label_smoothing and self.kind != "cross_entropy":
            raise ValueError("label_smoothing: smooths class labels; use it with cross_entropy")
        return self


class TrainingSection(Strict):
    """Training: `epochs` passes over the training examples in batches of `batch_size`
    (`full`: the whole set, one step an epoch), in an order drawn with shuffle_seed when
    `shuffle`; a last batch smaller than the others is trained on (`keep`) or left out (`drop`)."""

    epochs: PositiveInt
    batch_size: PositiveInt | Literal["full"]
    shuffle: bool
    shuffle_seed: Seed
    last_batch: Literal["keep", "drop"]


class LoggingSection(Strict):
    """The loss curve a record keeps, a point every `loss_every` steps; a long run's progress
    line every `print_every` steps."""

    loss_every: StepCount
    print_every: StepCount


# --- checks -------------------------------------------------------------------------------


class Close(Strict):
    """|a - b| <= atol + rtol * |b|, elementwise (numpy.allclose): a hand-set tolerance that
    overrides the calibrated one of a short-horizon check."""

    rtol: NonNegative
    atol: NonNegative


class StepCheck(Strict):
    """The parameters after `step` steps; calibrated unless rtol and atol override it."""

    step: StepCount = 10
    rtol: NonNegative | None = None
    atol: NonNegative | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> StepCheck:
        if (self.rtol is None) != (self.atol is None):
            raise ValueError("rtol and atol: give both (an override) or neither (calibrated)")
        return self

    @property
    def override(self) -> Close | None:
        return None if self.rtol is None else Close(rtol=self.rtol, atol=self.atol)


class Horizon(Strict):
    """The loss curves must agree to rtol, step by step, for at least must_hold_for steps
    (null: the whole run). The first step where they stop agreeing is the horizon."""

    rtol: Rate
    must_hold_for: StepCount | None


class Envelope(Strict):
    """The calibration of every float32 check. Let e be the largest distance between an
    array-module float32 run and the float64 oracle on this spec: the plain run and `members`
    more that take its float32 sums in other orders (members.reordered; per step for the
    curve, running maximum). Two runs may differ by at most factor * e + floor; the
    short-horizon checks use the same runs and factor (harness/calibrate/spread.py).

    `members` is a first sample, taken in three looks: none at first (the plain run's spread
    alone), the first member where a float32 check does not pass on that, the rest only where
    one does not pass on the first's (a check that passes on a smaller spread passes on
    more members': harness/calibrate/roles.py ZEROTH and FIRST_LOOK); the verdicts are
    those of every member. Where a float32 check fails on rounding alone (the float64
    twins agree with the oracle), e is measured again with `second_look` members in all
    before the check fails (harness/matrix.py): a network whose float32 training can take
    one of two paths (a layer norm over 2 features) sends about one member in ten down the
    other, which 4 members miss a third of the time. 0, or no more than `members`: none."""

    factor: Annotated[float, Field(ge=1)] = 10.0
    members: Annotated[int, Field(ge=0, le=MAX_MEMBERS)] = 4
    second_look: Annotated[int, Field(ge=0, le=MAX_MEMBERS)] = MAX_MEMBERS
    curve_floor: NonNegative = 1e-6
    output_floor: NonNegative = 1e-5
    metric_floor: NonNegative = 1e-6


class MathParity(Strict):
    """The float64 twins: every framework runs the spec's first `steps` steps in float64,
    judged against the oracle with a tolerance measured like the envelope's, from `members`
    float64 runs that sum in other orders (long_run.factor times their spread): none at first
    (the rounding floor alone), the first where a twin's check does not pass on that, the
    rest only where one does not pass on it (as the envelope's). A difference there is
    different math, not rounding."""

    steps: StepCount = 100
    members: Annotated[int, Field(ge=1, le=MAX_MEMBERS)] = 3
    # Re-anchored twins (harness/run/anchored.py): every `every` steps along the run, each
    # twin starts again from the oracle's state and is judged over `steps` steps. Unset:
    # at most 4 segments, evenly spaced.
    every: StepCount | None = None


class ChecksSection(Strict):
    """What is compared, and optional hand-set overrides of the calibrated tolerances."""

    probe_size: Annotated[int, Field(gt=0, le=MAX_PROBE)] = 256
    initial_outputs: Close | None = None
    initial_loss: Close | None = None
    params_after_first_step: Close | None = None
    params_after_steps: StepCheck = StepCheck()
    loss_curve: Horizon | None = None
    long_run: Envelope = Envelope()
    math_parity: MathParity = MathParity()


class TimingSection(Strict):
    """Each run trains `repeats` times from the same start (--repeats overrides it): the
    median time is the record's, the repeats' spread its noise, and the repeats must agree
    bit for bit."""

    repeats: Annotated[int, Field(gt=0, le=MAX_REPEATS)]


class SpeedupClaim(Strict):
    """What the source article claims for GPU over CPU, to set beside our measurement."""

    low: Annotated[float, Field(gt=0)]
    high: Annotated[float, Field(gt=0)]
    source: Annotated[str, Field(min_length=5)]

    @model_validator(mode="after")
    def _ordered(self) -> SpeedupClaim:
        if self.high < self.low:
            raise ValueError("high: smaller than low")
        return self


class Claims(Strict):
    """What the source article claims, set beside our measurement in the report."""

    gpu_speedup: SpeedupClaim | None = None


class Sweep(Strict):
    """A crossover sweep: the spec run at several values of one data key (e.g. the number
    of points), with a profile that shortens training; every point is an ordinary record."""

    key: Literal["data.points_per_axis", "data.n_samples"]
    values: Annotated[list[PositiveInt], Field(min_length=1, max_length=MAX_SWEEP_POINTS)]
    profile: Name


class Spec(Strict):
    name: Name
    title: str
    article: str
    choices: list[str] = []
    data: DataSection
    model: ModelSection
    init: InitSection
    loss: LossSection
    optimizer: Optimizer
    training: TrainingSection
    logging: LoggingSection
    checks: ChecksSection = ChecksSection()
    timing: TimingSection
    known_differences: list[KnownDifference] = []
    profiles: Annotated[dict[Name, dict[str, Any]], Field(max_length=MAX_PROFILES)] = {}
    claims: Claims = Claims()
    sweep: Sweep | None = None

    @property
    def plain_training(self) -> bool:
        """Plain SGD or Adam on the loss without label smoothing: what the fast modes take."""
        return self.optimizer.plain and not self.loss.label_smoothing

    @model_validator(mode="before")
    @classmethod
    def _text_input(cls, document: Any) -> Any:
        """A text data section gives the model its input, the token ids (model.tokens): its
        context and its vocabulary. A model that writes its own must agree."""
        if not isinstance(document, dict):
            return document
        data, model = document.get("data"), document.get("model")
        if not (isinstance(data, dict) and isinstance(model, dict)) or "tokens" in model:
            return document
        if data.get("kind") == "text":
            context, vocabulary = data.get("context"), VOCABULARY.get(data.get("tokens"), VOCABULARY["bytes"])
        elif data.get("kind") == "arrays" and isinstance(data.get("tokens"), dict):  # token arrays (harness.check_port)
            context, vocabulary = data["tokens"].get("context"), data["tokens"].get("vocabulary")
        else:
            return document
        # Where the data section is itself wrong (its own error says so), a stand-in keeps
        # the model's errors to the model's own.
        if not (isinstance(context, int) and 0 < context <= MAX_CONTEXT):
            context = 1
        if not (isinstance(vocabulary, int) and vocabulary > 0):
            vocabulary = 1
        return {**document, "model": {**model, "tokens": {"context": context, "vocabulary": vocabulary}}}

    @model_validator(mode="after")
    def _consistent(self) -> Spec:
        self._text_consistent()
        if self.model.is_port:
            self._port_consistent()
        elif self.init.weights is None or self.init.biases is None:
            raise ValueError("init: give weights and biases (the schemes the harness draws the layers' tensors by) and seed")
        n_out = self.model.n_outputs
        if self.loss.kind == "cross_entropy" and n_out is not None and n_out < 2:
            raise ValueError("model.layers: cross_entropy needs an output width of at least 2")
        if self.data.kind in ("peaks_grid", "moons") and self.model.in_shape != (2,):
            raise ValueError(f"model.input_width: {self.data.kind} data has 2 features")
        if self.data.kind == "peaks_grid" and (self.loss.kind != "mse" or n_out not in (1, None)):
            raise ValueError("loss.kind: peaks data is a regression target: use mse and 1 output")
        if self.data.kind == "moons" and (self.loss.kind != "cross_entropy" or n_out not in (2, None)):
            raise ValueError("loss.kind: moons data has 2 classes: use cross_entropy and 2 outputs")
        if self.data.kind == "idx" and self.model.input_shape is not None and self.model.input_shape[0] != 1:
            shape = self.model.input_shape
            raise ValueError(
                f"model.input_shape: {shape} has {shape[0]} channels, but IDX images have one (their files hold count x height x width): "
                f"give [1, height, width]"
            )
        if self.data.kind == "image_patterns":
            if self.model.in_shape != tuple(self.data.shape):
                raise ValueError(f"model.input_shape: image_patterns data has images of shape {self.data.shape}")
            if self.loss.kind != "cross_entropy" or n_out not in (self.data.classes, None):
                raise ValueError(f"loss.kind: image_patterns data has {self.data.classes} classes: use cross_entropy and as many outputs")
        step = self.checks.params_after_steps.step
        n = self.data.n_examples
        if n is not None:
            check_batching(self.training, n)
            if step > total_steps(self.training, n):
                raise ValueError("checks.params_after_steps.step: beyond the last training step")
        if self.sweep is not None and self.sweep.profile not in self.profiles:
            raise ValueError(f"sweep.profile: {self.sweep.profile!r} is not a profile of this spec")
        if self.sweep is not None and self.sweep.key.split(".")[1] not in type(self.data).model_fields:
            raise ValueError(f"sweep.key: {self.data.kind} data has no {self.sweep.key}")
        if self.profiles.get(FULL_PROFILE):
            raise ValueError(f"profiles.{FULL_PROFILE}: the full spec is the default, it takes no overrides")
        return self

    def _port_consistent(self) -> None:
        """A port: its module's initialisers make the weights. (An L2 term sums the weights
        of its torch module's Linear and convolution modules, and of the flax leaves its
        converter moves them to: harness/inputs/port.py penalized.)"""
        if self.init.weights is not None or self.init.biases is not None:
            raise ValueError("init: a port's weights are its torch module's own (torch.manual_seed(init.seed)): give seed alone")

    def _text_consistent(self) -> None:
        tokens, given = self.model.tokens, token_input(self.data)
        if tokens is not None and given is None:
            raise ValueError(f"model.tokens: a model of token ids takes text data or token arrays, not {self.data.kind}")
        if given is not None and tokens is None:
            raise ValueError("model: text data's input is its token ids: give no input_width or input_shape")
        if given is None:
            return
        (context, vocabulary), what = given, "text data" if self.data.kind == "text" else "token arrays"
        if (tokens.context, tokens.vocabulary) != given:
            raise ValueError(f"model.tokens: the {what} gives context {context} and vocabulary {vocabulary}")
        # a port's outputs are known once its module runs (harness/inputs/problem.py with_port checks them)
        if self.loss.kind != "cross_entropy" or (not self.model.is_port and self.model.n_outputs != vocabulary):
            raise ValueError(f"loss.kind: a text's targets are its next tokens: use cross_entropy and {vocabulary} outputs")
        if self.loss.l2 is not None:
            raise ValueError("loss.l2: not yet taken on a text model (which of its weights a penalty sums is not settled)")


def check_batching(training: TrainingSection, n_examples: int) -> None:
    """Reject a batch larger than the data when the rule would drop every batch."""
    bs = training.batch_size
    if bs != "full" and bs > n_examples and training.last_batch == "drop":
        raise ValueError(
            f"training.batch_size: {bs} is larger than the {n_examples} training examples and last_batch is 'drop', so no step would run"
        )


def batch_bounds(training: TrainingSection, n_examples: int) -> list[tuple[int, int]]:
    """The [start, stop) slices of one epoch's permutation, one per step."""
    if training.batch_size == "full":
        return [(0, n_examples)]
    bs = training.batch_size
    bounds = [(s, min(s + bs, n_examples)) for s in range(0, n_examples, bs)]
    if training.last_batch == "drop" and bounds[-1][1] - bounds[-1][0] < bs:
        bounds.pop()
    return bounds


def batches_per_epoch(training: TrainingSection, n_examples: int) -> int:
    """len(batch_bounds(...)), counted without making the list (a spec may ask for billions)."""
    if training.batch_size == "full":
        return 1
    whole, rest = divmod(n_examples, training.batch_size)
    return whole + (1 if rest and training.last_batch == "keep" else 0)


def total_steps(training: TrainingSection, n_examples: int) -> int:
    return training.epochs * batches_per_epoch(training, n_examples)
