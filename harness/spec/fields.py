"""The value types a spec's sections share, and the upper bounds of the counts a spec gives."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

PositiveInt = Annotated[int, Field(gt=0)]

# Upper bounds of the counts a spec gives, each far above the shipped specs' values (in
# brackets) and far below what would stall a run. The sizes of the data and the model and
# the number of epochs are not bounded here: harness/inputs/resources.py refuses them by
# the memory and the steps they make, limits that --max-memory-gb and --max-steps raise.
MAX_REPEATS = 100  # timing.repeats (1-3): each repeat is a whole timed training run
# A step or a number of steps named by a check or by logging (1,000 at most): 100 times
# the default --max-steps (10,000,000), so that the step limit is the one that binds, and
# an int64 whatever array it is put in.
MAX_STEP = 10**9
MAX_PROBE = 65_536  # checks.probe_size (256): rows whose outputs every run keeps
MAX_LAYERS = 128  # model.layers (2-9): each is a Python-level step of every forward pass
MAX_PROFILES = 32  # profiles (2-3): each is merged and validated whenever the spec loads
MAX_SWEEP_POINTS = 64  # sweep.values (8): each is a set of runs
MAX_MEMBERS = 16  # a calibration's members (4 and 3; 16 on the envelope's second look): each is a whole run
# data.noise (0.2): the standard deviation of the noise added to moons of radius 1; at 1
# the two classes already overlap. The report's decision-boundary figure draws a mesh of
# step 0.01 over the data's range: its points grow with the square of the noise (a noise
# of 1e6 asked for some 10^17 points; at 1, about a million).
MAX_MOONS_NOISE = 1.0

StepCount = Annotated[int, Field(gt=0, le=MAX_STEP)]
Seed = Annotated[int, Field(ge=0, lt=2**32)]
Rate = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Beta = Annotated[float, Field(ge=0, lt=1)]
Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)]
SourceName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]*$", max_length=64)]
# A bare file name: a spec cannot point the harness outside the data directory.
FileName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", max_length=128)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
