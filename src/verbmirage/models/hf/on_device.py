"""What the transformers engine does differently on CUDA to launch fewer kernels per scored prompt.

On a GPU a forward of a 7B language model costs far more than its arithmetic: every one of its 32 layers
launches its kernels, and the GPU of the H200 run sat idle 59% of a scoring pass (bench/README.md, "On a GPU").
Two changes apply there, both chosen by device so that the CPU path (the demo's reference results) stays as it
is, operation for operation:

- **Fewer, fuller forwards.** Suffix batches are cut where padding costs more than one more forward
  (``PrefixCache.BATCH_COST``, in token positions) and a text header shared by an image's prompts gets a
  forward of its own when it saves ``PrefixCache.HEADER_SAVING`` positions. On the CPU a forward costs little
  beyond its arithmetic (256 and 32 positions); on CUDA both are :data:`CUDA_FORWARD_COST`: a forward costs
  about as much as that many positions (its launches and one read of every weight), so the whole-suite pass of
  16 images runs one image-prefix forward and its 625 prompts in the fewest batches of at most 256 rows (4
  forwards of the language model, was 9: 2 header forwards, 6 suffix batches), for 45% more token positions.
  That trade pays where launches set a forward's cost (the H200's first run); where the GPU computes near its
  peak, a 7B model's forward costs nearer a few hundred positions, and :data:`FORWARD_COST_ENV` sets another
  value (bench/gpu_scoring.py ``--suite --forward-cost`` times a value against the default).
- **Compiled decoder layers** (:mod:`.compiled_layers`, ``VERBMIRAGE_COMPILE_LAYERS=0`` turns them off; GPUs
  older than Volta, and bfloat16 models on GPUs older than Ampere, run them eagerly), and FlexAttention for the attention over shared prefixes
  (:func:`.shared_prefix.kernel_for`; ``VERBMIRAGE_FLEX_ATTENTION=0`` turns it off, and GPUs older than Ampere
  attend in plain products): the job's log says which.
- **OPERA in one forward per step** (``VERBMIRAGE_OPERA_ONE_FORWARD=0`` turns it off). OPERA feeds each beam's
  candidate tokens side by side to read their attention rows, then feeds the chosen one; on CUDA the chosen
  candidate's logits, keys and values are taken from the candidates' forward instead
  (``InPlaceStepper.probe_feeds``): the same arithmetic, half the step forwards. On the CPU a token's logits
  fed beside others differ from its own forward's in their last bits (up to 5e-7 on the tiny LLaVA), so the
  CPU keeps its two forwards and its answers.

In bf16 a prompt's score depends on the rows it is batched with (docs/models.md, "Batch sizes"), so on CUDA
scores may move within bf16 rounding against the former cuts; decisions are compared on the GPU by
bench/batch_flips.py.
"""

from __future__ import annotations

import logging
import os

import torch

from verbmirage.models.base import COMPILE_FAILED
from verbmirage.models.hf.compiled_layers import (compile_decoder_layers, compiles_layers, cuda_capability, failures,
                                                  switched_off)
from verbmirage.models.hf.shared_prefix import FLEX_ENV, flex_off, kernel_for

log = logging.getLogger(__name__)

#: on CUDA, a forward's fixed cost in token positions: the suffix batches' cost per batch and the least saving
#: of a shared text header's forward (bench/launches.py counts the forwards this leaves)
CUDA_FORWARD_COST = 4096
#: a whole number of token positions in place of :data:`CUDA_FORWARD_COST` (on CUDA only): where a GPU computes
#: near its peak a forward costs less than that many positions, and fewer positions pay (bench/gpu_scoring.py
#: ``--suite --forward-cost`` times both)
FORWARD_COST_ENV = "VERBMIRAGE_FORWARD_COST"
#: ``0`` (or ``false``, ``no``, ``off``) turns OPERA's one forward per step on CUDA off (the CPU's two forwards: the candidates, then the chosen)
OPERA_ONE_FORWARD_ENV = "VERBMIRAGE_OPERA_ONE_FORWARD"


def fit_to_device(engine, model=None, device: torch.device | None = None):
    """Set ``engine`` (a ``TransformersVLM``) and its transformers ``model`` (default: ``engine.model``) up for
    ``device`` (default: the engine's own; bench/launches.py passes CUDA to count CUDA's path on the CPU): on
    CUDA fewer, fuller forwards and, for families whose suffix batches read their prefixes in place (LLaVA),
    compiled decoder layers, and OPERA in one forward per step (``engine.opera_one_forward``). Elsewhere nothing
    changes. Returns the model."""
    model = engine.model if model is None else model
    device = engine.device if device is None else device
    if device.type == "cuda":
        engine.opera_one_forward = not switched_off(OPERA_ONE_FORWARD_ENV)
        engine.prefix_cache.BATCH_COST = engine.prefix_cache.HEADER_SAVING = forward_cost()
        if engine.shared_prefix_attention:
            compile_decoder_layers(model, device, engine.name)
            log.info("%s: the attention over shared prefixes runs %s", engine.name,
                     _attention_kernel(device, _head_size(model)))
    return model


def _head_size(model) -> int:
    """The language model's attention head size."""
    text = model.config.get_text_config()
    return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads


def engine_device_path(engine) -> dict | None:
    """The transformers engine's :meth:`~verbmirage.models.base.VisionLanguageModel.device_path`: on CUDA the
    GPU's name and compute capability, the kernel chosen to attend over shared prefixes (``transformers`` where the
    family attends through transformers' own), whether the decoder layers are compiled, and the compiled parts
    that failed in this process (``compile_failed``, where any did: they run otherwise from then on); None
    elsewhere."""
    device = engine.device
    if device.type != "cuda":
        return None
    in_place = engine.shared_prefix_attention
    path = {"gpu": torch.cuda.get_device_name(device), "capability": ".".join(map(str, cuda_capability(device))),
            "attention": kernel_for(device, _head_size(engine.model), chosen=True) if in_place else "transformers",
            "compiled_layers": bool(in_place and compiles_layers(device, next(engine.model.parameters()).dtype))}
    if failures():
        path[COMPILE_FAILED] = failures()
    return path


def _attention_kernel(device: torch.device, head: int) -> str:
    """Which kernel attends over the shared prefixes on the CUDA ``device`` with heads of ``head``, and why, for
    the job's log."""
    if kernel_for(device, head) == "flex":
        return f"in FlexAttention's fused kernels ({FLEX_ENV}=0 attends in plain products)"
    return f"in plain products ({flex_off(device, head) or 'chosen so'})"


def forward_cost() -> int:
    """A forward's fixed cost on CUDA in token positions: :data:`FORWARD_COST_ENV` where set, else
    :data:`CUDA_FORWARD_COST`."""
    value = os.environ.get(FORWARD_COST_ENV, "").strip()
    if not value:
        return CUDA_FORWARD_COST
    if not (value.isascii() and value.isdigit() and int(value) >= 1):
        raise ValueError(f"{FORWARD_COST_ENV}={value!r}: expected a whole number of token positions, at least 1 "
                         f"(default {CUDA_FORWARD_COST})")
    return int(value)
