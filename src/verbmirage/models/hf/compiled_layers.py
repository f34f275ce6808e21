"""Regional compilation of the language model's decoder layers on CUDA: fewer kernel launches per forward.

On a GPU a scoring pass spends most of its time launching small kernels (bench/README.md, "On a GPU"): each
decoder layer runs its two RMS norms, the rotary embedding, seven products, the activation and the residual
additions as some thirty separate operations. Compiled by ``torch.compile`` (PyTorch's "regional compilation":
the repeated block compiled once, with dynamic shapes, and that one compiled code run by every layer and every
batch size), the elementwise work around the products fuses into a few kernels.

The attention itself (:mod:`.shared_prefix`, whose FlexAttention is compiled on its own) and the writes into the
cache stay outside the compiled graphs (``torch.compiler.disable``): the layer compiles into short graphs
around the attention call (its norm; projections and rotary embedding; output projection; residual, norm, MLP
and residual). A layer whose attention is read by a hook or runs eagerly for its weights (OPERA's record,
the attention analysis) runs uncompiled.

A compilation costs a GPU seconds to tens of seconds, so once each kind of call has run (scoring, several
images, greedy continuations, beam search, sampling, VCD, OPERA) calls of other sizes compile nothing new
(tests/models/test_compile_stable.py): sizes are dynamic, sizes equal by chance are not taken as equal
(:func:`compiler_settings`), and what moves per layer or step (the caches' updates) stays out of the graphs.
A row count or token count of one is a variant of its own, compiled once.

A compilation that fails (inductor's or Triton's code on a GPU or a torch it was not tried on) does not end a
job on a GPU: the code it was for runs eagerly from there (dynamo's ``suppress_errors``, set by
:func:`compile_decoder_layers` there, which falls back where the failure is, so nothing that ran already, a cache's
update, runs twice; dynamo does not try that function again in the process), the job's log says where and why,
once per model and function, and the record kept with the job's answers says so (``on_device.engine_device_path``).
The attention over shared prefixes switches to plain products instead (:func:`calling`), whether its compiled
code fails to compile or when it first runs; compiled decoder layers that fail when they run, past their
compilation, still end the job.

Chosen by device like the attention kernel (:func:`.shared_prefix.kernel_for`): on CUDA, the CPU path stays
eager (the demo's results are byte-identical). ``VERBMIRAGE_COMPILE_LAYERS=0`` turns it off (e.g. where the
first batches' wait for the compiler is not worth it); the tests and ``bench/launches.py`` compile on the CPU
with :func:`compile_decoder_layers` ``(force=True)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
from typing import NamedTuple

import torch
import torch.fx.experimental._config

from verbmirage.models.hf.tokens import decoder_layers, is_out_of_memory

log = logging.getLogger(__name__)

#: the environment switch: ``0`` (or ``false``, ``no``, ``off``) keeps the decoder layers eager on CUDA too
ENV = "VERBMIRAGE_COMPILE_LAYERS"

#: at most this many compiled variants of a layer (shapes of size 0 or 1, the image-prefix, suffix and decoding
#: forwards each compile their own); beyond it a variant runs eagerly
RECOMPILE_LIMIT = 32


def switched_off(variable: str) -> bool:
    """Whether the environment ``variable`` of a CUDA-only choice says no (``0``, ``false``, ``no``, ``off``)."""
    return os.environ.get(variable, "").strip().lower() in ("0", "false", "no", "off")


#: the least CUDA compute capability inductor's Triton kernels run on (Volta: V100); older GPUs run eagerly
MIN_CAPABILITY = (7, 0)
#: the least CUDA compute capability inductor compiles bfloat16 for (Ampere: native bfloat16); below it a bfloat16
#: model's layers run eagerly
MIN_BF16_CAPABILITY = (8, 0)


def compiles_layers(device: torch.device, dtype: torch.dtype | None = None) -> bool:
    """Whether the decoder layers of a model on ``device`` (its weights in ``dtype``) are compiled: on CUDA of at
    least :data:`MIN_CAPABILITY` (:data:`MIN_BF16_CAPABILITY` for bfloat16, which inductor compiles only where the
    GPU has it natively) unless :data:`ENV` says no."""
    if device.type != "cuda" or switched_off(ENV):
        return False
    least = MIN_BF16_CAPABILITY if dtype == torch.bfloat16 else MIN_CAPABILITY
    return cuda_capability(device) >= least


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    if not torch.cuda.is_available():
        return (99, 0)
    return tuple(torch.cuda.get_device_capability(torch.cuda.current_device() if index is None else index))


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """The (major, minor) compute capability of the CUDA ``device``, read once per device. Where no CUDA device
    can be asked (CUDA's path set up on a CPU, as bench/launches.py and the tests do) that of the newest GPUs,
    so that the path is the one a current GPU runs."""
    return _capability(device.index)


@functools.cache
def compiler_settings() -> None:
    """The compiler's settings for the engine's compiled code (the decoder layers here, FlexAttention and the merge
    of :mod:`.shared_prefix`), made once, before its first compilation."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    # a layer's index (read by the cache update) an input of the graph, not a constant compiled into it
    torch._dynamo.config.allow_unspec_int_on_nn_module = True
    # sizes equal by chance in the call that compiles (4 rows of 4 tokens) not taken as equal in every later call:
    # each call whose sizes differ would compile again
    torch.fx.experimental._config.use_duck_shape = False
    watched = logging.getLogger("torch._dynamo.convert_frame")
    watched.addFilter(_watch_compiler)
    if watched.getEffectiveLevel() > logging.WARNING:  # its failures reach the filter whatever TORCH_LOGS says
        watched.setLevel(logging.WARNING)


#: the model whose decoder layers run (:func:`_dispatch`), named in the warnings about its compiled code
_RUNNING: contextvars.ContextVar = contextvars.ContextVar("verbmirage_compiled_model", default="")
#: the compiled part being called (:func:`calling`; None: the decoder layers), whose failure the log reports
_CALLING: contextvars.ContextVar = contextvars.ContextVar("verbmirage_compiled_part", default=None)
#: (model, function) pairs already warned about
_WARNED: set = set()
#: the compiled parts that failed in this process, each with its reason (:func:`note_failure`)
_FAILURES: dict[str, str] = {}


class Part(NamedTuple):
    """Compiled code whose failure the job's log and record name (:func:`note_failure`)."""

    name: str
    afterwards: str  # what runs from then on, for the log


#: the decoder layers' name among the failures (:func:`failures`): one of their functions failed to compile (it
#: runs eagerly from there; the others stay compiled)
LAYERS = "the decoder layers"


def _watch_compiler(record: logging.LogRecord) -> bool:
    """A filter on torch's compiler log, which names neither the model nor what runs from then on: warn once in
    the job's log where compiled code reaches its recompile limit (torch logs it once and from then on runs every
    call it has not compiled for eagerly, slow, without saying so again), and where a compilation failed (run
    eagerly instead: ``suppress_errors``), naming the model and the function. A failure inside a part called
    through :func:`calling` switches that part off (:func:`note_failure`). Keeps torch's own record."""
    if str(record.msg).startswith("torch._dynamo hit config.") and len(record.args or ()) >= 3:
        limit, function = f"{record.args[0]} ({record.args[1]})", record.args[2]
        _warn_once(function, "%s: torch.compile reached its %s in %s: its calls of shapes not compiled yet now run "
                   "eagerly (slow); TORCH_LOGS=recompiles says what kept compiling (%s=0 keeps the layers eager)",
                   limit, function, ENV)
    elif record.levelno >= logging.WARNING and record.exc_info and record.exc_info[1] is not None:
        part = _CALLING.get()
        if part is not None:
            note_failure(part, record.exc_info[1])
            return True
        function = record.getMessage().split("\n", 1)[0].removeprefix("WON'T CONVERT ")
        reason = _reason(record.exc_info[1])
        _FAILURES.setdefault(LAYERS, reason)
        _warn_once(function, "%s: torch.compile failed in %s (%s): it runs eagerly from there on (slower, rounded as "
                   "eager code rounds; %s=0 keeps the layers eager)", function, reason, ENV)
    return True


def _warn_once(function: str, message: str, *args) -> None:
    """``log.warning(message, model, *args)`` once per model (the one whose compiled code runs) and function."""
    model = _model()
    if (model, function) not in _WARNED:
        _WARNED.add((model, function))
        log.warning(message, model, *args)


def _model() -> str:
    """The model whose compiled code runs, for the job's log."""
    return _RUNNING.get() or "a model on CUDA's path"


def _reason(error: BaseException) -> str:
    """The type and the first line of the message of the error that started ``error`` (torch wraps a compiler's
    error in its own: ``BackendCompilerFailed``'s ``inner_exception``), for the job's log."""
    for _ in range(8):  # a chain of causes, not a cycle
        cause = error.__cause__ or getattr(error, "inner_exception", None)
        if not isinstance(cause, BaseException):
            break
        error = cause
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:300]}" if first else type(error).__name__


def note_failure(part: Part, error: BaseException) -> None:
    """``part`` failed to compile or to run compiled: it is not compiled again in this process (:func:`failed`);
    the job's log says why and what runs instead, once."""
    if part.name not in _FAILURES:
        _FAILURES[part.name] = _reason(error)
        log.warning("%s: torch.compile failed for %s (%s): %s", _model(), part.name, _FAILURES[part.name],
                    part.afterwards)


def failed(part: Part) -> bool:
    """Whether ``part`` failed to compile in this process (:func:`note_failure`)."""
    return part.name in _FAILURES


def failures() -> list[str]:
    """The names of the compiled parts that failed in this process (:data:`LAYERS` among them where a decoder
    layer's function did), sorted."""
    return sorted(_FAILURES)


def calling(part: Part, compiled, eager, *args, **kwargs):
    """``compiled(*args, **kwargs)``, a compiled pure function; where it fails, to compile (dynamo's fallback runs
    it eagerly, :func:`_watch_compiler` notes the failure) or raising (on its first run on a GPU, say), ``part``
    runs uncompiled from now on (:func:`note_failure`) and this call returns ``eager(*args, **kwargs)``: nothing
    ran twice that should not, as the function is pure. Out of memory is raised (the engine halves its batch)."""
    token = _CALLING.set(part)
    try:
        return compiled(*args, **kwargs)
    except Exception as error:
        if is_out_of_memory(error):
            raise
        note_failure(part, error)
        return eager(*args, **kwargs)
    finally:
        _CALLING.reset(token)


@functools.cache
def _compiled(layer_class: type):
    """``layer_class.forward`` compiled once (dynamic shapes), shared by every layer of that class."""
    compiler_settings()
    _cache_updates_uncompiled()
    return torch.compile(layer_class.forward, dynamic=True)


@functools.cache
def _cache_updates_uncompiled() -> None:
    """transformers' caches updated outside the compiled graphs: traced, an update reads its layer's index and
    whether that layer's cache is filled yet, and each value would compile the layer once more (one variant
    per layer and forward). The same function runs, so nothing changes where the layers run eagerly."""
    from transformers import Cache

    Cache.update = torch.compiler.disable(Cache.update)


def _runs_eagerly(layer) -> bool:
    """Whether ``layer``'s attention is read as it runs (a hook on it, or eager attention for its weights)."""
    attention = getattr(layer, "self_attn", None)
    if attention is None:
        return True
    config = getattr(attention, "config", None)
    return bool(attention._forward_hooks) or getattr(config, "_attn_implementation", None) == "eager"


#: set within :func:`eager_layers`: compiled decoder layers run eagerly
_EAGER: contextvars.ContextVar = contextvars.ContextVar("verbmirage_eager_layers", default=False)


@contextlib.contextmanager
def eager_layers():
    """Within the block, decoder layers wrapped by :func:`compile_decoder_layers` run eagerly, as transformers'
    own: bench/gen_vs_engine.py's ``generate`` at batch 1, the harnesses' path it measures the engine against
    (compiled, it would also wait for the compiler's variants of its own shapes)."""
    token = _EAGER.set(True)
    try:
        yield
    finally:
        _EAGER.reset(token)


def _dispatch(layer, eager, name: str, *args, **kwargs):
    if _EAGER.get() or _runs_eagerly(layer):
        return eager(*args, **kwargs)
    token = _RUNNING.set(name)
    try:
        return _compiled(type(layer))(layer, *args, **kwargs)
    finally:
        _RUNNING.reset(token)


def compile_decoder_layers(model, device: torch.device | None = None, name: str = "", force: bool = False) -> bool:
    """Run ``model``'s language-model decoder layers compiled (see the module's text) where
    :func:`compiles_layers` says so for ``device`` (``force``: on any device); returns whether they are."""
    dtype = next(model.parameters()).dtype
    if not force and (device is None or not compiles_layers(device, dtype)):
        return False
    layers = decoder_layers(model)
    name = name or type(model).__name__
    if not force:  # a job on a GPU: a compilation that fails runs eagerly (see the module's text), not raising
        torch._dynamo.config.suppress_errors = True
    for layer in layers:
        if "forward" not in vars(layer):  # not wrapped already
            layer.forward = functools.partial(_dispatch, layer, layer.forward, name)
    log.info("%s: %d decoder layers compiled by torch.compile (dynamic shapes; the first batches wait for the "
             "compiler; %s=0 keeps them eager)", name, len(layers), ENV)
    return True
