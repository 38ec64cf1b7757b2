"""Sliding windows over images (N, C, H, W), shared by convolution and pooling: the
padding rules, the windows as a strided view, and the sum of window gradients back onto
the image (the adjoint of taking the windows)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

Array = Any
Pair = Annotated[list[Annotated[int, Field(ge=0, le=64)]], Field(min_length=2, max_length=2)]
# valid | same (the JAX/TF rule) | [[top, bottom], [left, right]]
Padding = Literal["valid", "same"] | Annotated[list[Pair], Field(min_length=2, max_length=2)]


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """JAX's and TensorFlow's "SAME": ceil(size / stride) outputs; an odd total pads one
    more at the end (the bottom, the right), at any stride."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pads(padding: Padding, height: int, width: int, kernel: int, stride: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right))."""
    if padding == "valid":
        return (0, 0), (0, 0)
    if padding == "same":
        return same_pads(height, kernel, stride), same_pads(width, kernel, stride)
    (top, bottom), (left, right) = padding
    return (top, bottom), (left, right)


def out_size(size: int, kernel: int, stride: int, before: int = 0, after: int = 0) -> int:
    return (size + before + after - kernel) // stride + 1


def check_fits(shape, kernel: int, stride: int, padding: Padding, what: str) -> tuple[int, int]:
    """The output height and width, or a ValueError when the window does not fit."""
    if len(shape) != 3:
        raise ValueError(f"{what} takes an image (channels, height, width), not a vector of {shape[0]}")
    _, h, w = shape
    (top, bottom), (left, right) = pads(padding, h, w, kernel, stride)
    if h + top + bottom < kernel or w + left + right < kernel:
        raise ValueError(f"{what}: a window of {kernel} does not fit an image of {h}x{w} (padded {top}+{bottom}, {left}+{right})")
    return out_size(h, kernel, stride, top, bottom), out_size(w, kernel, stride, left, right)


def padded(xp, x: Array, pad) -> Array:
    (top, bottom), (left, right) = pad
    if not (top or bottom or left or right):
        return x
    return xp.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))


def windows(xp, x: Array, kernel: int, stride: int, out_h: int, out_w: int) -> Array:
    """(N, C, out_h, out_w, kernel, kernel): every window, a view of x (already padded)."""
    view = xp.lib.stride_tricks.sliding_window_view(x, (kernel, kernel), axis=(2, 3))
    return view[:, :, : (out_h - 1) * stride + 1 : stride, : (out_w - 1) * stride + 1 : stride]


def unwindow(xp, d_windows: Array, padded_shape, kernel: int, stride: int) -> Array:
    """The adjoint of `windows`: each window's gradient added back where the window was
    (overlapping windows add), on the padded image."""
    n, c, out_h, out_w = d_windows.shape[:4]
    d_x = xp.zeros(padded_shape, dtype=d_windows.dtype)
    for i in range(kernel):
        for j in range(kernel):
            d_x[:, :, i : i + (out_h - 1) * stride + 1 : stride, j : j + (out_w - 1) * stride + 1 : stride] += d_windows[..., i, j]
    return d_x


def unpadded(d_x: Array, pad) -> Array:
    (top, bottom), (left, right) = pad
    h, w = d_x.shape[2], d_x.shape[3]
    return d_x[:, :, top : h - bottom, left : w - right]
