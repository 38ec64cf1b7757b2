"""The bounded numbers of the layers' spec sections."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

PositiveInt = Annotated[int, Field(gt=0)]
# A kernel, window or stride: far above any image the harness trains (6-28 pixels).
Extent = Annotated[int, Field(gt=0, le=64)]
Channels = Annotated[int, Field(gt=0, le=4096)]
Eps = Annotated[float, Field(gt=0, le=1)]
