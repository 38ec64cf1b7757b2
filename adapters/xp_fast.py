"""The fast mode of the array-module MLP (harness.reference.network, for dense networks): the same training, written the
way CuPy's best users write it, against one array module `xp` (NumPy or CuPy).

- Every array a step touches (activations, pre-activations, gradients, optimizer
  temporaries, the batch) is allocated once, at build; each operation writes into one of
  them (`out=`, in-place updates). A step allocates no arrays.
- The floating-point operations are the network oracle's, in the network oracle's order, with the network oracle's scalars
  (Python floats cast to the dtype, as NumPy 2 and CuPy cast weak scalars). On NumPy the
  fast mode is therefore bitwise identical to the eager one (tests/test_fast_xp.py).
- On the GPU (`xp is not numpy`), the element-wise chains are fused kernels compiled with
  `--fmad=false` (each rounds like the ufunc sequence it replaces: no contraction into
  FMAs), products are cuBLAS (`xp.matmul(out=)`), reductions are CuPy's (as in eager), and
  the whole step is captured in one CUDA graph per batch size, replayed once per step with
  no host synchronisation. What varies per step is read on the device: a step counter the
  graph increments, which indexes Adam's bias corrections (precomputed on the host in
  float64, cast to the dtype), the loss log slot and the minibatch's rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.core import threads
from harness.optimizers import adam
from harness.reference import network

# --------------------------------------------------------------------------- GPU kernels

_FMAD_OFF = ("--fmad=false",)
# the update rules this step trains, as plain rules (Recipe.plain); any other kind is refused
FAST_RULES = ("sgd", "adam")

_ACT = {
    "relu": "a = isnan(z) ? z : max(z, T(0));",
    "tanh": "a = tanh(z);",
}
_ACT_GRAD = {
    "relu": "d = d * (z > T(0) ? T(1) : T(0));",  # d_a * (z > 0).astype(dtype)
    "tanh": "d = d * (T(1) - a * a);",  # d_a * (1 - a * a)
}


def _kernels(cupy, loss_kind: str) -> dict[str, Any]:
    """The fused element-wise kernels (compiled on first call, cached by CuPy)."""
    ek = cupy.ElementwiseKernel
    k = {}
    for name, act in _ACT.items():
        k[f"bias_{name}"] = ek("T b", "T z, T a", f"z = z + b; {act}", f"fast_bias_{name}", options=_FMAD_OFF)
    k["bias_identity"] = ek("T b", "T z", "z = z + b;", "fast_bias_identity", options=_FMAD_OFF)
    for name, grad in _ACT_GRAD.items():
        k[f"grad_{name}"] = ek("T z, T a", "T d", grad, f"fast_grad_{name}", options=_FMAD_OFF)
    if loss_kind == "mse":
        # diff = out - y; total = sum(diff * diff); d_out = (2 * diff) / denom
        k["mse"] = ek(
            "T o, T y, T denom",
            "T sq, T d",
            "T diff = o - y; sq = diff * diff; d = (T(2) * diff) / denom;",
            "fast_mse",
            options=_FMAD_OFF,
        )
    else:
        # log_softmax: shifted = logits - max; logp = shifted - log(sum(exp(shifted)))
        k["shift"] = ek(
            "T logits, T mx",
            "T shifted, T e",
            "shifted = logits - mx; e = exp(shifted);",
            "fast_shift",
            options=_FMAD_OFF,
        )
        # d_out = exp(logp); d_out[rows, targets] -= 1; d_out / denom; picked = logp[rows, targets]
        k["ce"] = ek(
            "T shifted, T s, raw I t, int64 ncls, T denom",
            "T d, raw T picked",
            "T lp = shifted - log(s); T e = exp(lp); long long r = i / ncls;"
            " if (i - r * ncls == (long long)t[r]) { picked[r] = lp; e = e - T(1); } d = e / denom;",
            "fast_ce",
            options=_FMAD_OFF,
        )
    k["sgd"] = ek("T g, T lr", "T p", "p = p - lr * g;", "fast_sgd", options=_FMAD_OFF)
    k["sgd_l2"] = ek("T g, T lr, T s2", "T p", "T gg = g + s2 * p; p = p - lr * gg;", "fast_sgd_l2", options=_FMAD_OFF)
    adam = (
        "T c1 = c1t[step[0]]; T c2 = c2t[step[0]];"
        " T m2 = b1 * m + omb1 * g;"
        " T v2 = b2 * v + omb2 * (g * g);"
        " p = p - (lr * (m2 / c1)) / (sqrt(v2 / c2) + eps);"
        " m = m2; v = v2;"
    )
    args = "raw T c1t, raw T c2t, raw int64 step, T lr, T b1, T omb1, T b2, T omb2, T eps"
    k["adam"] = ek(f"T g0, {args}", "T p, T m, T v", f"T g = g0; {adam}", "fast_adam", options=_FMAD_OFF)
    k["adam_l2"] = ek(f"T g0, {args}, T s2", "T p, T m, T v", f"T g = g0 + s2 * p; {adam}", "fast_adam_l2", options=_FMAD_OFF)
    # the minibatch rows: order[offsets[step] + row]
    k["gather"] = ek(
        "raw S src, raw int64 order, raw int64 offsets, raw int64 step, int64 cols",
        "S dst",
        "long long r = order[offsets[step[0]] + i / cols]; dst = src[r * cols + i % cols];",
        "fast_gather",
        options=_FMAD_OFF,
    )
    # loss = (-)total / denom (+ scale * (parts[0] + parts[1] + ...)); log[step] = loss; step += 1
    k["finish"] = ek(
        "raw T total, raw T parts, int32 nparts, bool negate, T denom, T scale",
        "raw T log, raw int64 step",
        "T loss = negate ? -total[0] : total[0]; loss = loss / denom;"
        " if (nparts > 0) { T acc = parts[0]; for (int j = 1; j < nparts; ++j) acc = acc + parts[j];"
        " loss = loss + scale * acc; }"
        " log[step[0]] = loss; step[0] = step[0] + 1;",
        "fast_finish",
        options=_FMAD_OFF,
    )
    return k


# --------------------------------------------------------------------------- buffers


class _Workspace:
    """Every per-batch array of one batch size, allocated once. `fused` (the GPU): the
    fused kernels need no buffers for the intermediate results of an element-wise chain."""

    def __init__(self, xp, n: int, widths, activations, dtype, x, y, gathered: bool, loss_kind: str, fused: bool):
        self.n = n
        self.x = xp.empty((n, x.shape[1]), dtype) if gathered else x
        self.y = xp.empty((n, *y.shape[1:]), y.dtype) if gathered else y
        self.z, self.a, self.d, self.g = [], [], [], []
        for width, act in zip(widths, activations):
            z = xp.empty((n, width), dtype)
            self.z.append(z)
            self.a.append(xp.empty((n, width), dtype) if act in _ACT else z)
            self.d.append(xp.empty((n, width), dtype))  # d loss / d a, then d loss / d z in place
            self.g.append(xp.empty((n, width), dtype) if act in _ACT and not fused else None)  # act'(z)
        out_width = widths[-1]
        self.total1 = xp.zeros(1, dtype)  # the data term's sum (the finishing kernel reads it raw)
        self.total = self.total1[0, ...]  # the same, 0-d: what a full reduction writes into
        if loss_kind == "mse":
            self.sq = xp.empty((n, out_width), dtype)
            self.diff = None if fused else xp.empty((n, out_width), dtype)
        else:
            self.mx = xp.empty((n, 1), dtype)
            self.shifted = xp.empty((n, out_width), dtype)
            self.e = xp.empty((n, out_width), dtype)
            self.s = xp.empty((n, 1), dtype)
            self.picked = xp.empty(n, dtype)
            if not fused:
                self.logp = xp.empty((n, out_width), dtype)
                self.rows = xp.arange(n) * out_width  # flat index of row r's first logit
                self.flat = xp.empty(n, self.rows.dtype)
        self.graph = None


class FastMLP:
    """The preallocated training step of one trainer, and the loop over steps."""

    def __init__(self, xp, problem, data: dict[str, Any], params, dtype: str, loss_log):
        spec = problem.spec
        self.xp, self.problem, self.data, self.dtype = xp, problem, data, np.dtype(dtype)
        self.on_gpu = xp is not np
        self.activations = [layer.activation for layer in spec.model.layers]
        self.widths = [layer.width for layer in spec.model.layers]
        self.loss = spec.loss
        self.opt = spec.optimizer
        self.params = params  # updated in place
        self.loss_log = loss_log
        self.scale = network.l2_scale(spec.loss, len(problem.x_train))
        self.grads = [(xp.empty_like(w), xp.empty_like(b)) for w, b in params]
        self.wsq = [xp.empty_like(w) for w, _ in params] if self.scale else []
        self.parts = xp.zeros(len(params), self.dtype)  # sum(W^2) of each layer
        # NumPy: the temporaries of the update (the GPU's fused kernels keep them in registers)
        self.tmp = [] if self.on_gpu else [(xp.empty_like(w), xp.empty_like(b)) for w, b in params]
        self.tmp2 = [] if self.on_gpu else [(xp.empty_like(w), xp.empty_like(b)) for w, b in params]
        total = problem.total_steps
        if self.opt.kind not in FAST_RULES:
            raise ValueError(f"the allocation-free step trains {' and '.join(FAST_RULES)} only, not {self.opt.kind}")
        self.adam = self.opt.kind == "adam"  # else plain gradient descent (FAST_RULES)
        if self.adam:
            self.m = [(xp.zeros_like(w), xp.zeros_like(b)) for w, b in params]
            self.v = [(xp.zeros_like(w), xp.zeros_like(b)) for w, b in params]
            # 1 - beta^t for t = step + 1, in float64 (the Python floats the network oracle uses), rounded once
            # (or optax's float32 ones, where a member computes that library's behaviour)
            corrections = adam.float32_bias_corrections if problem.float32_corrections else adam.bias_corrections
            table = np.array([corrections(self.opt, t) for t in range(1, total + 1)], np.float64)
            self.c1, self.c2 = (xp.asarray(np.ascontiguousarray(col).astype(self.dtype)) for col in table.reshape(-1, 2).T)
        self.gathered = problem.batch_order is not None
        self.sizes = [problem.batch_size(t) for t in range(total)]
        self.spaces = {
            n: _Workspace(xp, n, self.widths, self.activations, self.dtype, data["x"], data["y"], self.gathered, self.loss.kind, self.on_gpu)
            for n in sorted(set(self.sizes))
        }
        if self.on_gpu:
            import cupy

            self.k = _kernels(cupy, self.loss.kind)
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.pool = cupy.cuda.MemoryPool()  # the temporaries a captured graph refers to live here only
            self.graphs_refused: str | None = None  # why the step is not captured, where CuPy refuses it
            self.step = xp.zeros(1, np.int64)  # the device-side step counter
            if self.gathered:
                order = data["order"]
                self.order = order.reshape(-1)
                n_train = order.shape[1]
                offsets = [problem.batch_slice(t)[0] * n_train + problem.batch_slice(t)[1] for t in range(total)]
                self.offsets = xp.asarray(np.array(offsets, np.int64))

    # ------------------------------------------------------------------ the step

    def _batch(self, ws: _Workspace, t: int | None) -> None:
        if not self.gathered:
            return
        if self.on_gpu:
            gather = self.k["gather"]
            gather(self.data["x"], self.order, self.offsets, self.step, np.int64(ws.x.shape[1]), ws.x)
            gather(self.data["y"], self.order, self.offsets, self.step, np.int64(1), ws.y)
            return
        epoch, start, stop = self.problem.batch_slice(t)
        rows = self.data["order"][epoch, start:stop]
        np.take(self.data["x"], rows, axis=0, out=ws.x, mode="clip")
        np.take(self.data["y"], rows, axis=0, out=ws.y, mode="clip")

    def _forward(self, ws: _Workspace) -> None:
        xp = self.xp
        a = ws.x
        for i, ((w, b), act) in enumerate(zip(self.params, self.activations)):
            z = ws.z[i]
            xp.matmul(a, w, out=z)  # z = a @ w + b
            if self.on_gpu:
                name = act if act in _ACT else "identity"
                self.k[f"bias_{name}"](b, z, *(() if z is ws.a[i] else (ws.a[i],)))
            else:
                np.add(z, b, out=z)
                if act == "relu":
                    np.maximum(z, 0, out=ws.a[i])
                elif act == "tanh":
                    threads.unary(np, np.tanh, z, out=ws.a[i])  # on the job's cores, the same bits
            a = ws.a[i]

    def _loss(self, ws: _Workspace) -> None:
        """The data term's sum (ws.total), d loss / d outputs (ws.d[-1]) and sum(W^2) per layer."""
        xp = self.xp
        out, d = ws.a[-1], ws.d[-1]
        mean = self.loss.reduction == "mean"
        if self.loss.kind == "mse":
            denom = out.size if mean else 1
            if self.on_gpu:
                self.k["mse"](out, ws.y, self.dtype.type(denom), ws.sq, d)
            else:
                np.subtract(out, ws.y, out=ws.diff)
                np.multiply(ws.diff, ws.diff, out=ws.sq)
                np.multiply(2, ws.diff, out=d)
                np.divide(d, denom, out=d)
            xp.sum(ws.sq, out=ws.total)
        else:
            n, classes = out.shape
            denom = n if mean else 1
            xp.max(out, axis=1, keepdims=True, out=ws.mx)
            if self.on_gpu:
                self.k["shift"](out, ws.mx, ws.shifted, ws.e)
                xp.sum(ws.e, axis=1, keepdims=True, out=ws.s)
                self.k["ce"](ws.shifted, ws.s, ws.y, np.int64(classes), self.dtype.type(denom), d, ws.picked)
            else:
                np.subtract(out, ws.mx, out=ws.shifted)
                np.exp(ws.shifted, out=ws.e)
                np.sum(ws.e, axis=1, keepdims=True, out=ws.s)
                np.log(ws.s, out=ws.s)
                np.subtract(ws.shifted, ws.s, out=ws.logp)
                np.add(ws.rows, ws.y, out=ws.flat)
                flat_logp, flat_d = ws.logp.reshape(-1), d.reshape(-1)
                np.take(flat_logp, ws.flat, out=ws.picked, mode="clip")
            xp.sum(ws.picked, out=ws.total)
            if not self.on_gpu:
                np.exp(ws.logp, out=d)
                np.take(flat_d, ws.flat, out=ws.picked, mode="clip")
                np.subtract(ws.picked, 1, out=ws.picked)
                np.put(flat_d, ws.flat, ws.picked, mode="clip")
                np.divide(d, denom, out=d)
        for k, (w, _) in enumerate(self.params if self.scale else ()):
            xp.multiply(w, w, out=self.wsq[k])
            xp.sum(self.wsq[k], out=self.parts[k, ...])

    def _backward(self, ws: _Workspace) -> None:
        xp = self.xp
        two_scale = 2 * self.scale
        for i in reversed(range(len(self.params))):
            act, d_z = self.activations[i], ws.d[i]
            if act in _ACT:  # d_z = d_a * act'(z), in place
                if self.on_gpu:
                    self.k[f"grad_{act}"](ws.z[i], ws.a[i], d_z)
                else:
                    g = ws.g[i]
                    if act == "relu":
                        np.greater(ws.z[i], 0, out=g)
                    else:
                        np.multiply(ws.a[i], ws.a[i], out=g)
                        np.subtract(1, g, out=g)
                    np.multiply(d_z, g, out=d_z)
            a_in = ws.x if i == 0 else ws.a[i - 1]
            w = self.params[i][0]
            d_w, d_b = self.grads[i]
            xp.matmul(a_in.T, d_z, out=d_w)
            if self.scale and not self.on_gpu:  # on the GPU, fused into the update
                tmp = self.tmp[i][0]
                np.multiply(two_scale, w, out=tmp)
                np.add(d_w, tmp, out=d_w)
            xp.sum(d_z, axis=0, out=d_b)
            if i:
                xp.matmul(d_z, w.T, out=ws.d[i - 1])

    def _update(self, t: int | None) -> None:
        opt, dtype = self.opt, self.dtype.type
        l2 = bool(self.scale) and self.on_gpu
        s2 = dtype(2 * self.scale)
        for k, ((w, b), (gw, gb)) in enumerate(zip(self.params, self.grads)):
            for j, (p, g) in enumerate(((w, gw), (b, gb))):
                with_l2 = l2 and j == 0  # weights only, never biases
                if self.adam:
                    m, v = self.m[k][j], self.v[k][j]
                    if self.on_gpu:
                        consts = (dtype(opt.lr), dtype(opt.beta1), dtype(1 - opt.beta1), dtype(opt.beta2), dtype(1 - opt.beta2), dtype(opt.eps))
                        name = "adam_l2" if with_l2 else "adam"
                        self.k[name](g, self.c1, self.c2, self.step, *consts, *((s2,) if with_l2 else ()), p, m, v)
                    else:
                        t1, t2 = self.tmp[k][j], self.tmp2[k][j]
                        c1, c2 = self.c1[t], self.c2[t]
                        np.multiply(opt.beta1, m, out=m)  # m = beta1 * m + (1 - beta1) * g
                        np.multiply(1 - opt.beta1, g, out=t1)
                        np.add(m, t1, out=m)
                        np.multiply(g, g, out=t1)  # v = beta2 * v + (1 - beta2) * (g * g)
                        np.multiply(1 - opt.beta2, t1, out=t1)
                        np.multiply(opt.beta2, v, out=v)
                        np.add(v, t1, out=v)
                        np.divide(m, c1, out=t1)  # p = p - lr * (m / c1) / (sqrt(v / c2) + eps)
                        np.multiply(opt.lr, t1, out=t1)
                        np.divide(v, c2, out=t2)
                        np.sqrt(t2, out=t2)
                        np.add(t2, opt.eps, out=t2)
                        np.divide(t1, t2, out=t1)
                        np.subtract(p, t1, out=p)
                elif self.on_gpu:
                    if with_l2:
                        self.k["sgd_l2"](g, dtype(opt.lr), s2, p)
                    else:
                        self.k["sgd"](g, dtype(opt.lr), p)
                else:  # p = p - lr * g
                    np.multiply(opt.lr, g, out=g)
                    np.subtract(p, g, out=p)

    def _finish(self, ws: _Workspace, t: int | None) -> None:
        """The logged loss: the data term's mean plus the L2 term, into loss_log[step]."""
        ce = self.loss.kind != "mse"
        mean = self.loss.reduction == "mean"
        denom = (ws.a[-1].size if not ce else ws.n) if mean else 1
        nparts = len(self.params) if self.scale else 0
        if self.on_gpu:
            self.k["finish"](
                ws.total1,
                self.parts,
                np.int32(nparts),
                ce,
                self.dtype.type(denom),
                self.dtype.type(self.scale),
                self.loss_log,
                self.step,
                size=1,
            )
            return
        total = ws.total
        if ce:
            np.negative(total, out=total)
        np.divide(total, denom, out=total)
        if nparts:
            acc = self.parts[0, ...]
            for k in range(1, nparts):
                np.add(acc, self.parts[k, ...], out=acc)
            np.multiply(self.scale, acc, out=acc)
            np.add(total, acc, out=total)
        self.loss_log[t] = total

    def _step(self, ws: _Workspace, t: int | None) -> None:
        """One optimizer step: on NumPy, step t (the host index); on the GPU, the step the
        device counter names (t is None: this same call is what a graph captures)."""
        self._batch(ws, t)
        self._forward(ws)
        self._loss(ws)
        self._backward(ws)
        self._update(t)
        self._finish(ws, t)

    # ------------------------------------------------------------------ the loop

    def state(self) -> list:
        arrays = [a for pair in self.params for a in pair]
        if self.adam:
            arrays += [a for pair in (*self.m, *self.v) for a in pair]
        return arrays

    def buffers(self) -> list:
        """Every preallocated array (the tests check that training keeps using them)."""
        found = [*self.state(), *(a for pair in (*self.grads, *self.tmp, *self.tmp2) for a in pair), *self.wsq, self.parts]
        for ws in self.spaces.values():
            found += [v for v in vars(ws).values() if hasattr(v, "shape")]
            found += [a for group in (ws.z, ws.a, ws.d, ws.g) for a in group if a is not None]
        return found

    def warm_up(self, plan) -> None:
        """NumPy: nothing to do. GPU: compile the kernels with one eager step, capture one
        graph per batch size the plan's steps use, then put the initial state back."""
        if not self.on_gpu:
            return
        import cupy

        first_of = self.problem.first_step_of_each_size(plan)
        if not first_of:
            return
        sizes = list(first_of)
        initial = [a.copy() for a in self.state()]
        self.stream.wait_event(cupy.cuda.get_current_stream().record())
        with cupy.cuda.using_allocator(self.pool.malloc), self.stream:
            for n in sizes:  # compile, and let the pool, cuBLAS and CUB allocate what they need
                self.step.fill(first_of[n])
                self._step(self.spaces[n], None)
            for n in sizes:
                ws = self.spaces[n]
                self.stream.begin_capture()
                try:
                    self._step(ws, None)
                except NotImplementedError as exc:
                    # CuPy refuses every cuBLAS call in a capture (cupy_backends/cuda/libs/cublas.pyx,
                    # setStream, as of 14.2; seen on the first GPU contact): the step's kernels are
                    # then launched one by one, from the same buffers, and the record says so
                    self.stream.end_capture()  # the part captured is dropped: nothing of it ran
                    self.graphs_refused = f"CuPy would not capture the step in a CUDA graph ({exc}): its kernels are launched one by one"
                    break
                except Exception as exc:
                    self.stream.end_capture()
                    raise RuntimeError(f"capturing the fast step (batch size {n}) in a CUDA graph failed: {exc}") from exc
                ws.graph = self.stream.end_capture()
            for dst, src in zip(self.state(), initial):
                cupy.copyto(dst, src)
            self.loss_log.fill(0)
            self.step.fill(0)
        self.stream.synchronize()

    def train(self, start: int, stop: int) -> None:
        if not self.on_gpu:
            for t in range(start, stop):
                self._step(self.spaces[self.sizes[t]], t)
            return
        import cupy

        stream = self.stream
        stream.wait_event(cupy.cuda.get_current_stream().record())  # after put/build's copies
        with cupy.cuda.using_allocator(self.pool.malloc), stream:
            self.step.fill(start)
            for t in range(start, stop):
                ws = self.spaces[self.sizes[t]]
                if ws.graph is not None:
                    ws.graph.launch(stream)
                else:  # not warmed for this batch size: the same kernels, launched one by one
                    self._step(ws, None)
        cupy.cuda.get_current_stream().wait_event(stream.record())  # later reads wait, the host does not

    def synchronize(self) -> None:
        if self.on_gpu:
            self.stream.synchronize()


def describe(device: str) -> str:
    if device == "cpu":
        return (
            "NumPy, preallocated allocation-free step: every op writes into buffers made at build "
            "(out=, in place), the network oracle's operations in the network oracle's order (bitwise equal to eager)"
        )
    return (
        "CuPy, one CUDA graph per batch size replayed once per step (no host sync) where CuPy "
        "captures one; CuPy (14.2) refuses any cuBLAS call during a capture, so a step with products "
        "launches its kernels one by one from the same buffers instead: fused "
        "element-wise kernels (--fmad=false) for bias+activation, its derivative, the loss gradient "
        "and SGD/Adam; cuBLAS products and CuPy reductions into preallocated buffers; device step "
        "counter indexes Adam's bias corrections, the loss log and the batch rows"
    )
