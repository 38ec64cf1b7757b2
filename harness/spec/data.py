"""A spec's `data` section: each data kind's keys (the peaks grid, moons, an IDX image set,
small seeded images, a text, a user's own arrays), validated as the rest of the spec is."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from harness.core.strict import Strict
from harness.spec.fields import MAX_MOONS_NOISE, FileName, Name, PositiveInt, Rate, Seed, Sha256, SourceName


class PeaksData(Strict):
    """MATLAB's peaks surface sampled on a square grid (the Flux article)."""

    kind: Literal["peaks_grid"]
    points_per_axis: Annotated[int, Field(ge=2)]
    low: float
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> PeaksData:
        if not self.low < self.high:
            raise ValueError("low must be smaller than high")
        return self

    @property
    def n_examples(self) -> int:
        return self.points_per_axis**2


class MoonsData(Strict):
    """scikit-learn's make_moons, reproduced, after np.random.seed(seed) (Theano article)."""

    kind: Literal["moons"]
    n_samples: Annotated[int, Field(ge=2)]
    noise: Annotated[float, Field(ge=0, le=MAX_MOONS_NOISE)]
    seed: Seed

    @property
    def n_examples(self) -> int:
        return self.n_samples


class IdxFile(Strict):
    """A data file by bare name, with the sha256 of the gzip file and of its contents."""

    file: FileName
    sha256: Sha256
    raw_sha256: Sha256 | None = None


class IdxSource(Strict):
    """One image/label file pair and how many of its examples are held out for validation."""

    images: IdxFile
    labels: IdxFile
    validation: PositiveInt
    note: str = ""


class IdxData(Strict):
    """An IDX image data set (MNIST and its kin), split at random into train and validation."""

    kind: Literal["idx"]
    dataset: Name
    scale: Rate
    split_seed: Seed
    source: SourceName
    sources: dict[SourceName, IdxSource]

    @model_validator(mode="after")
    def _source_known(self) -> IdxData:
        if self.source not in self.sources:
            raise ValueError(f"source {self.source!r} is not one of {sorted(self.sources)}")
        return self

    @property
    def n_examples(self) -> int | None:
        return None  # known once the files are read


class ImagePatterns(Strict):
    """Small seeded images, each class a random smooth pattern under noise (the generated
    family's image workloads; harness.inputs.data.image_patterns)."""

    kind: Literal["image_patterns"]
    n_samples: Annotated[int, Field(ge=2, le=100_000)]
    shape: Annotated[list[Annotated[int, Field(gt=0, le=64)]], Field(min_length=3, max_length=3)]  # channels, height, width
    classes: Annotated[int, Field(ge=2, le=100)]
    noise: Annotated[float, Field(ge=0, le=10)]
    seed: Seed

    @property
    def n_examples(self) -> int:
        return self.n_samples


# The longest context a text example may have: its scores are context^2 per head.
MAX_CONTEXT = 4096
# The vocabulary of each kind of tokens.
VOCABULARY = {"bytes": 256}


class TextData(Strict):
    """A text file by bare name (looked up in the data folder, checked against its sha256),
    read as tokens (`bytes`: each byte a token, 256 of them), cut into examples of `context`
    tokens whose targets are the next token at every position; `validation` examples held
    out at random (split_seed); harness.inputs.data.load_text."""

    kind: Literal["text"]
    file: FileName
    sha256: Sha256
    tokens: Literal["bytes"]
    context: Annotated[int, Field(gt=0, le=MAX_CONTEXT)]
    validation: PositiveInt
    split_seed: Seed

    @property
    def vocabulary(self) -> int:
        return VOCABULARY[self.tokens]

    @property
    def n_examples(self) -> int | None:
        return None  # known once the file is read


class ArrayTokens(Strict):
    """A user's arrays of token ids: examples of `context` ids below `vocabulary`, each
    position's target the next id, as kind text cuts a text."""

    context: Annotated[int, Field(gt=0, le=MAX_CONTEXT)]
    vocabulary: PositiveInt


class ArraysData(Strict):
    """A user's own arrays (harness.check_port's `data` given as NumPy arrays): a NumPy .npz
    file by bare name, looked up in the data folder and checked against its sha256, holding
    x_train and y_train and, both or neither, x_val and y_val: float32 features (vectors, or
    images as channels x height x width) and integer labels (cross entropy) or float32
    targets (mse); with `tokens`, integer token ids and their next tokens, (n, context) each.
    Read without unpickling anything (harness.inputs.data.load_arrays)."""

    kind: Literal["arrays"]
    file: FileName
    sha256: Sha256
    tokens: ArrayTokens | None = None

    @property
    def n_examples(self) -> int | None:
        return None  # known once the file is read


def token_input(section: object) -> tuple[int, int] | None:
    """The (context, vocabulary) of a data section of token ids (a text, or token arrays);
    None for one of features."""
    if isinstance(section, TextData):
        return section.context, section.vocabulary
    if isinstance(section, ArraysData) and section.tokens is not None:
        return section.tokens.context, section.tokens.vocabulary
    return None


DataSection = Annotated[PeaksData | MoonsData | IdxData | ImagePatterns | TextData | ArraysData, Field(discriminator="kind")]
