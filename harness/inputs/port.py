"""A user's own port (model.python): the file beside the spec that defines their torch
module, their flax module and the converter between them, run as pytest runs a test file.

The file must define:
- `torch_model() -> torch.nn.Module`, called after `torch.manual_seed(init.seed)`: its
  initial tensors (state_dict()) are the run's initial tensors, for every framework;
- `flax_model() -> flax.linen.Module`, whose `__call__(x, train: bool = False)` takes the
  input in flax's layout (NHWC for images) and keeps batch statistics in `batch_stats`;
- `torch_to_flax(state: dict[str, numpy.ndarray]) -> dict`, flax's variables (`params`,
  and `batch_stats` if any) from torch's state_dict() as NumPy arrays.

Only `harness run` gets here: loading a spec reads the file's bytes and hashes them
(harness/spec/load.py port_source); the bytes hashed are the bytes run. A port's tensors
are named and laid out as torch's state_dict() names them (its floating tensors: batch
norm's running statistics too, not its counter). Whatever fails in the user's code is a
PortError: one line naming the file and what failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.core.errors import SpecError
from harness.core.files import read_regular
from harness.spec.load import PORT_MAX_BYTES

FUNCTIONS = ("torch_model", "flax_model", "torch_to_flax")


class PortError(SpecError):
    """The user's code failed: one line naming the file and what failed."""


def call(path: Path, what: str, fn, *args, **kwargs):
    """`fn(*args)`, user code: any exception it raises becomes one PortError line."""
    try:
        return fn(*args, **kwargs)
    except PortError:
        raise
    except Exception as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise PortError(f"{path}: {what} raised {detail}{_mend(exc)}") from None


def _mend(exc: Exception) -> str:
    """What to do, where a failure has a known cause: flax asking for a "dropout" PRNG is a
    dropout the harness cannot turn off (it makes flax's nn.Dropout deterministic, not a rate
    given to a function, such as HF's attention dropout)."""
    if type(exc).__name__ == "InvalidRngError" and '"dropout"' in str(exc):
        return (
            " (a dropout the harness cannot turn off: it makes flax's nn.Dropout deterministic, not a rate passed to a function "
            "such as dot_product_attention_weights; set that rate to 0 on both sides, e.g. a transformers config's attn_pdrop=0.0)"
        )
    return ""


def check_loaded(path: Path, loaded_sha256: str | None, functions: dict[str, str] | None = None) -> None:
    """The port's file is the one loading the spec read: a spec rebuilt from a record (the
    report) never runs a port, nor does a file changed since it was read. `functions`: the
    qualified names that play FUNCTIONS' roles in it (model.functions; by default their own)."""
    if loaded_sha256 is None:
        raise PortError(f"{path}: a port runs only in `harness run`, from its spec loaded there")
    source = read_regular(path, PORT_MAX_BYTES, "port file", error=PortError)
    found = hashlib.sha256(source).hexdigest()
    if found != loaded_sha256:
        raise PortError(f"{path}: changed since its spec was loaded (sha256 {found[:12]}, read as {loaded_sha256[:12]})")
    _CHECKED[str(path)] = (source, {role: (functions or {}).get(role, role) for role in FUNCTIONS})


# Each port file's bytes as check_loaded found them, and the names of its functions, by
# path: the bytes that run.
_CHECKED: dict[str, tuple[bytes, dict[str, str]]] = {}


def module(path: Path) -> types.ModuleType:
    """The port's file as a module, its three functions checked (one per file and content,
    in each process): the bytes check_loaded hashed."""
    checked = _CHECKED.get(str(path))
    if checked is None:
        raise PortError(f"{path}: a port runs only in `harness run`, once its bytes are checked against its spec's loading")
    source, names = checked
    found = _module(str(path), source)
    missing = [name for name in names.values() if not callable(_named(found, name))]
    if missing:
        raise PortError(f"{path}: defines no {', '.join(f'{m}()' for m in missing)} (a port defines {', '.join(FUNCTIONS)})")
    return found


def function(path: Path, role: str):
    """The port's function that plays `role` (one of FUNCTIONS): by its own name, or by the
    qualified name model.functions gives it; or the callable harness.check_port was given,
    where it runs everything in its own process (given)."""
    here = _GIVEN.get(str(path))
    if here is not None:
        return here[role]
    found = module(path)
    return _named(found, _CHECKED[str(path)][1][role])


def _named(found: types.ModuleType, qualname: str):
    """`found`'s object at a dotted qualified name ("make_model", "Models.torch"), else None."""
    at: Any = found
    for part in qualname.split("."):
        at = getattr(at, part, None)
    return at


# The callables harness.check_port(in_process=True) was given, by their source file's path.
_GIVEN: dict[str, dict[str, Any]] = {}


@contextlib.contextmanager
def given(path: Path, callables: dict[str, Any] | None) -> Iterator[None]:
    """While it lasts, `callables` play their roles for the port file `path` in this process
    (none: the file's own functions, as in any worker)."""
    if callables is None:
        yield
        return
    _GIVEN[str(path)] = dict(callables)
    try:
        yield
    finally:
        _GIVEN.pop(str(path), None)


@functools.cache
def _module(path: str, source: bytes) -> types.ModuleType:
    name = f"harness_port_{hashlib.sha256(source).hexdigest()[:16]}"
    found = types.ModuleType(name)
    found.__file__ = path
    sys.modules[name] = found  # dataclasses (flax's modules) look their module up by name
    try:
        code = compile(source, path, "exec")
    except SyntaxError as exc:
        raise PortError(f"{path}: not valid Python: line {exc.lineno}: {exc.msg}") from None
    call(Path(path), "importing it", exec, code, found.__dict__)
    return found


def torch_module(path: Path, seed: int):
    """The user's torch module, made after torch.manual_seed(seed)."""
    import torch

    torch.manual_seed(seed)
    made = call(path, "torch_model()", function(path, "torch_model"))
    if not isinstance(made, torch.nn.Module):
        raise PortError(f"{path}: torch_model() returned {type(made).__name__}, not a torch.nn.Module")
    return made


def flax_module(path: Path, dtype: str = "float32"):
    """The user's flax module for a run in `dtype` ("float32", "float64"): flax_model(), or
    flax_model(dtype=jnp.float32 / jnp.float64) where it takes a `dtype` keyword (as HF's
    Flax modules take their computation's dtype), so that the float64 twin computes in
    float64."""
    import flax.linen as nn
    import jax.numpy as jnp

    made_by = function(path, "flax_model")
    if _takes_dtype(made_by):
        made = call(path, f"flax_model(dtype=jnp.{dtype})", made_by, dtype=getattr(jnp, dtype))
    else:
        made = call(path, "flax_model()", made_by)
    if not isinstance(made, nn.Module):
        raise PortError(f"{path}: flax_model() returned {type(made).__name__}, not a flax.linen.Module")
    return made


def _takes_dtype(fn) -> bool:
    """Whether `fn` takes a keyword `dtype`."""
    try:
        found = inspect.signature(fn).parameters.get("dtype")
    except (TypeError, ValueError):
        return False
    return found is not None and found.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def dropout_functions(torch) -> frozenset:
    """torch's dropouts, which nn.Dropout and its kin call and a forward may call itself."""
    f = torch.nn.functional
    return frozenset({f.dropout, f.dropout1d, f.dropout2d, f.dropout3d, f.alpha_dropout, f.feature_alpha_dropout})


def dropout_call(args, kwargs) -> tuple[float, bool]:
    """A dropout function's rate and training flag, however it was called (p=0.5 and
    training=True are F.dropout's defaults)."""
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    training = kwargs.get("training", args[2] if len(args) > 2 else True)
    return float(p), bool(training)


def first_array(output):
    """A module's output as the harness compares it: the output itself where it is an array
    (a torch tensor, a jax or NumPy array), else the first array in it, depth first, in its
    own order: a tuple's or list's first, a mapping's first value (HF's ModelOutput keeps only
    the fields it was given), a dataclass's first field, Nones passed over (HF's Flax
    modules' tuples hold them). None where it holds no array."""
    if output is None or (hasattr(output, "shape") and hasattr(output, "dtype")):
        return output
    if hasattr(output, "values") and callable(output.values):
        inside = list(output.values())
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        inside = [getattr(output, field.name) for field in dataclasses.fields(output)]
    elif isinstance(output, tuple | list):
        inside = list(output)
    else:
        return None
    for value in inside:
        found = first_array(value)
        if found is not None:
            return found
    return None


# A flax module's output keyed by the torch module the converter pairs it with, where their
# paths differ (adapters/jax_port.py module_pairs): "torch/path (flax's flax/path)", which
# the diagnosis says as it is, naming both sides.
FLAX_SIDE = " (flax's "


def paired(torch_path: str, flax_path: str) -> str:
    """The key of a flax module's output paired with torch's module `torch_path`."""
    return torch_path if torch_path == flax_path else f"{torch_path}{FLAX_SIDE}{flax_path})"


def torch_side(key: str) -> str:
    """The torch module's path of a key made by `paired` (any other key as it is)."""
    return key.split(FLAX_SIDE, 1)[0]


# scaled_dot_product_attention's parameters up to dropout_p (query, key, value, attn_mask, dropout_p)
_ATTENTION_DROPOUT_AT = 4


def attention_dropout(args, kwargs) -> float:
    """The dropout_p a call of torch's scaled_dot_product_attention draws with (0.0 its default)."""
    return float(kwargs.get("dropout_p", args[_ATTENTION_DROPOUT_AT] if len(args) > _ATTENTION_DROPOUT_AT else 0.0))


def attention_without_dropout(args, kwargs) -> tuple[tuple, dict]:
    """The same call of scaled_dot_product_attention with dropout_p 0."""
    if len(args) > _ATTENTION_DROPOUT_AT:
        return (*args[:_ATTENTION_DROPOUT_AT], 0.0, *args[_ATTENTION_DROPOUT_AT + 1 :]), kwargs
    return args, {**kwargs, "dropout_p": 0.0}


def torch_dropout(path: Path, seed: int, in_shape: tuple[int, ...], tokens: bool = False) -> tuple[str, ...]:
    """Where the torch module drops, seen in one training-mode pass over two examples of
    zeros: each dropout call with p > 0, by the dropout module that makes it ("drop1
    (p=0.1)"), or "dropout(p=0.2) called in forward" where the forward calls it itself. A
    port runs with every one turned off (adapters/torch_port.py _no_dropout)."""
    import torch
    from torch.overrides import TorchFunctionMode

    made = torch_module(path, seed).double().train()
    functions, within, found = dropout_functions(torch), [], []

    def enter(name):
        def hook(module, inputs):
            within.append(name)

        return hook

    def leave(module, inputs, output):
        within.pop()

    for name, part in made.named_modules():
        if isinstance(part, torch.nn.modules.dropout._DropoutNd):
            part.register_forward_pre_hook(enter(name))
            part.register_forward_hook(leave)

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in functions:
                p, training = dropout_call(args, kwargs)
                if p > 0 and training:
                    found.append(f"{within[-1]} (p={p:g})" if within else f"{func.__name__}(p={p:g}) called in forward")
            elif func is torch.nn.functional.scaled_dot_product_attention and attention_dropout(args, kwargs) > 0:
                found.append(f"scaled_dot_product_attention(dropout_p={attention_dropout(args, kwargs):g})")
            return func(*args, **kwargs)

    with torch.no_grad(), Spy():
        call(path, "the torch module's forward", made, torch_example(torch, in_shape, tokens))
    return tuple(dict.fromkeys(found))


def floating(state: dict[str, Any]) -> dict[str, np.ndarray]:
    """A torch state_dict's floating tensors (its tensors by name; batch norm's counter is
    left out) as float64 NumPy arrays."""
    return {k: v.detach().cpu().double().numpy() for k, v in state.items() if v.is_floating_point()}


def tied(state: dict[str, Any]) -> dict[str, str]:
    """The state_dict's floating names that hold the very tensor an earlier name holds (tied
    weights: GPT-2's lm_head.weight is its token embedding, wte.weight), each with that
    earlier name: one parameter, named once everywhere in the harness."""
    first: dict[tuple, str] = {}
    found = {}
    for name, value in state.items():
        if not value.is_floating_point() or value.numel() == 0:
            continue
        key = (value.data_ptr(), tuple(value.shape), tuple(value.stride()), value.dtype)
        if key in first:
            found[name] = first[key]
        else:
            first[key] = name
    return found


def untied(state: dict[str, Any]) -> dict[str, Any]:
    """A state_dict's floating tensors, a tied one once, by its first name (tied)."""
    aliases = tied(state)
    return {k: v for k, v in state.items() if v.is_floating_point() and k not in aliases}


def initial_state(path: Path, seed: int) -> tuple[dict[str, np.ndarray], tuple[tuple[str, str], ...]]:
    """The run's initial tensors: the torch module's own, as float32, every one finite, a
    tied tensor once (by its first name); and the tied names, each with the name kept."""
    made = torch_module(path, seed)
    state = made.state_dict()
    aliases = tied(state)
    tensors = {k: a.astype(np.float32) for k, a in floating(untied(state)).items()}
    if not tensors:
        raise PortError(f"{path}: torch_model() has no floating tensors to train")
    bad = [k for k, a in tensors.items() if not np.isfinite(a).all()]
    if bad:
        raise PortError(f"{path}: torch_model()'s initial {bad[0]} is not finite")
    return tensors, tuple(aliases.items())


def with_tied(tensors: dict[str, Any], tied_names: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """`tensors` (by the names kept) with each tied name too, holding its tensor: the
    state_dict torch_to_flax is given, as torch's state_dict() lists a tied tensor under
    each name."""
    return {**tensors, **{alias: tensors[kept] for alias, kept in tied_names if kept in tensors}}


# torch's layers whose options a library entry may name (harness/known_differences.yaml
# `layers`), as a spec's layer of that kind would say them: torch's batch norm stores the
# unbiased variance.
TORCH_OPTIONS = {"_BatchNorm": ("batch_norm.running_var=unbiased",)}


def layer_options(path: Path, seed: int) -> tuple[str, ...]:
    """The layer options the port's torch module shows (TORCH_OPTIONS), sorted."""
    import torch

    found = set()
    for part in torch_module(path, seed).modules():
        for kind, options in TORCH_OPTIONS.items():
            if isinstance(part, getattr(torch.nn.modules.batchnorm, kind)):
                found.update(options)
    return tuple(sorted(found))


def flax_options(path: Path, in_shape: tuple[int, ...], tokens: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The layer options the port's flax module shows, found by its own init (evaluation
    mode) under flax's method interceptor, sorted: "batch_norm.variance=fast" where one of
    its BatchNorms computes the batch's variance as E[x^2] - E[x]^2 (use_fast_variance,
    flax's default), a float32 rounding of its own (harness/known_differences.yaml), and
    "layer_norm.variance=fast" where a LayerNorm computes each example's so, which cancels
    in float64 too over few features whose mean is large beside their spread. And its
    Dropouts with a rate above 0 ("Dropout_0 (rate 0.1)"), which a port runs deterministic
    (adapters/jax_port.py)."""
    import flax.linen as nn

    found, dropping = set(), []
    fast = ((nn.BatchNorm, "batch_norm.variance=fast"), (nn.LayerNorm, "layer_norm.variance=fast"))

    def spy(next_fun, args, kwargs, context):
        for kind, option in fast:
            if isinstance(context.module, kind) and getattr(context.module, "use_fast_variance", True):
                found.add(option)
        if isinstance(context.module, nn.Dropout) and context.method_name == "__call__" and context.module.rate > 0:
            dropping.append(f"{'/'.join(context.module.path) or context.module.name} (rate {context.module.rate:g})")
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(spy):
        flax_init(path, flax_module(path), in_shape, tokens)
    return tuple(sorted(found)), tuple(dict.fromkeys(dropping))


def flax_init(path: Path, net, in_shape: tuple[int, ...], tokens: bool = False):
    """flax_model().init's variables as shapes and dtypes, traced (jax.eval_shape; the eager init compiled each op,
    3.0 s of a port's 6.2 s of facts); run eagerly where tracing fails (an init reading its values), its error the user's."""
    import jax

    key, x = jax.random.PRNGKey(0), flax_example(in_shape, tokens)
    try:
        return jax.eval_shape(lambda k, v: net.init(k, v, train=False), key, x)
    except Exception:
        return call(path, "flax_model().init", net.init, key, x, train=False)


def flax_example(in_shape: tuple[int, ...], tokens: bool = False) -> np.ndarray:
    """One example of zeros as the flax module takes it (flax_model().init's input): images
    NHWC, a text's token ids as int32 (nn.Embed's)."""
    if tokens:
        return np.zeros((1, *in_shape), dtype=np.int32)
    x = np.zeros((1, *in_shape), dtype=np.float32)
    return x.transpose(0, 2, 3, 1) if len(in_shape) == 3 else x


def torch_example(torch, in_shape: tuple[int, ...], tokens: bool = False):
    """Two examples of zeros as the torch module takes them, in float64 (the module made
    double), or a text's token ids as int64 (nn.Embedding's)."""
    return torch.zeros((2, *in_shape), dtype=torch.int64 if tokens else torch.float64)


def penalized_kinds(torch) -> tuple[type, ...]:
    """The modules whose weight an L2 penalty sums: Linear and every convolution (a spec's
    dense and conv layers, and a port's modules of those classes)."""
    return (torch.nn.Linear, torch.nn.modules.conv._ConvNd)


def penalized(path: Path, seed: int) -> tuple[str, ...]:
    """The state_dict names of the weights an L2 penalty sums (loss.l2): those of the torch
    module's penalized_kinds, as adapters/torch_layers.py objective sums them on torch's side."""
    import torch

    made = torch_module(path, seed)
    aliases = tied(made.state_dict())
    names = (f"{name}.weight" if name else "weight" for name, part in made.named_modules() if isinstance(part, penalized_kinds(torch)))
    return tuple(dict.fromkeys(aliases.get(name, name) for name in names))


def output_width(path: Path, seed: int, in_shape: tuple[int, ...], tokens: bool = False) -> int:
    """The width of the torch module's output on two examples (evaluation mode): one vector
    per example, or for a text's token ids one per position (the logits over the vocabulary)."""
    import torch

    made = torch_module(path, seed).double().eval()
    with torch.no_grad():
        out = call(path, "the torch module's forward", made, torch_example(torch, in_shape, tokens))
    wanted = (2, *in_shape) if tokens else (2,)
    if not isinstance(out, torch.Tensor) or out.ndim != len(wanted) + 1 or tuple(out.shape[:-1]) != wanted:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        what = f"{wanted[0]}, {wanted[1]}, vocabulary" if tokens else "2, outputs"
        raise PortError(f"{path}: the torch module's output on 2 examples of shape {in_shape} is {shape}, not ({what})")
    return int(out.shape[-1])


@dataclass(frozen=True)
class Facts:
    """What the driver learns from a port's torch module (harness/inputs/problem.py with_port)."""

    width: int  # output_width
    options: tuple[str, ...]  # layer_options and flax_options
    penalized: tuple[str, ...]  # penalized
    initial: dict[str, np.ndarray]  # initial_state
    dropout: tuple[str, ...] = ()  # torch_dropout's and flax_options' dropouts, each "torch: ..." or "flax: ..."
    tied: tuple[tuple[str, str], ...] = ()  # initial_state's tied names, each with the name kept


def facts(
    path: Path,
    loaded_sha256: str | None,
    functions: dict[str, str] | None,
    seed: int,
    in_shape: tuple[int, ...],
    tokens: bool = False,
    wanted: tuple[str, int] | None = None,
) -> Facts:
    """The port's Facts, its bytes checked first: called apart from `harness run`'s driver
    (harness/matrix.py port_apart: in the process the local executor keeps for torch's
    calibration runs, else a fresh one), which then never imports the user's file (nor the
    flax and JAX it imports: JAX's gc callback swallowed a lease's Ctrl-C in the driver,
    which then ran on until killed). torch's module first, its output width checked against
    the data's (`wanted`: fits_data), so that data the module cannot take is said before flax
    is imported."""
    check_loaded(path, loaded_sha256, functions)
    width = output_width(path, seed, in_shape, tokens)
    if wanted is not None:
        fits_data(path, width, *wanted)
    torch_options, torch_dropped = layer_options(path, seed), torch_dropout(path, seed, in_shape, tokens)
    initial, tied_names = initial_state(path, seed)
    flax, flax_dropout = flax_options(path, in_shape, tokens)
    dropout = tuple(f"torch: {d}" for d in torch_dropped) + tuple(f"flax: {d}" for d in flax_dropout)
    return Facts(width, tuple(sorted(torch_options + flax)), penalized(path, seed), initial, dropout, tied_names)


def fits_data(path: Path, width: int, what: str, wanted: int) -> None:
    """A PortError where `width` outputs cannot take the data: `wanted` "targets" (mse), or "labels" up to `wanted`."""
    if what == "targets" and width != wanted:
        raise PortError(f"{path}: the torch module gives {width} outputs; the data's targets have {wanted}")
    if what == "labels" and (width < 2 or wanted >= width):
        raise PortError(f"{path}: the torch module gives {width} outputs; the data's labels go up to {wanted}")
