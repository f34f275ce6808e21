"""The shared-prefix attention's CUDA path (models/hf/shared_prefix.py: FlexAttention, a block mask per forward,
the log-sum-exp merge) against the CPU path, the reference: on the CPU, FlexAttention runs eagerly and must give
the CPU path's scores and answers within float32 rounding; on CUDA (``pytest -m gpu``, bench/h200_check.sh) the
compiled kernels must give them within bf16 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verbmirage.models import Question
from verbmirage.models.hf import shared_prefix
from verbmirage.models.hf.shared_prefix import _attention, shared_prefix_attention, use_kernel

from test_shared_prefix import llava  # noqa: F401, F811  (the fixture)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class _Config:  # what shared_prefix_attention reads of a language model's config
    _attn_implementation_internal = "sdpa"


class _Layer(torch.nn.Module):  # what the attention reads of its layer
    layer_idx = 0


def _mixed_questions(questions):
    return questions + [Question(f"yn{i}", f"Is the person {verb} the horse?", questions[i].image)
                        for i, verb in zip((0, 5, 2), ("riding", "feeding a very small", "washing"))]


def _answers(model, questions, kernel: str | None, entry: dict | None = None):
    """P(yes) or option probabilities and raw answers of ``questions`` with every attention on ``kernel``."""
    from verbmirage.variants.settings import Variant

    flags = [bool(q.options) for q in questions]
    model.use_variant(Variant.from_config(entry or {}))
    try:
        model.forget_prefixes()
        if kernel is None:
            results = model.score_mixed(questions, flags)
        else:
            with use_kernel(kernel):
                results = model.score_mixed(questions, flags)
    finally:
        model.use_variant(Variant())
    scores = np.concatenate([np.atleast_1d(r.option_probs if hasattr(r, "option_probs") else r.p_yes)
                             for r in results])
    return scores, [r.raw_answer for r in results]


@pytest.fixture(scope="module")
def mixed(llava):  # noqa: F811
    """test_shared_prefix.py's tiny LLaVA and its MC questions on two images, with YN questions beside them."""
    model, questions = llava
    return model, _mixed_questions(questions)


@pytest.mark.parametrize("entry", [{}, {"decoding": "beam", "num_beams": 2, "max_new_tokens": 4}])
def test_flex_attention_scores_and_decodes_as_the_cpu_path_on_tiny_llava(mixed, entry, monkeypatch):
    """Scoring (suffix batches over two images' prefixes and shared headers) and decoding steps (RowCache, a
    mask of each row's own columns) with FlexAttention equal the CPU flash kernel's within 1e-5; the block mask
    is built once per forward, not per layer."""
    model, questions = mixed
    model.continue_tokens = 4
    try:
        reference, reference_answers = _answers(model, questions, None, entry)
        built = []
        real = shared_prefix._own_block_mask
        monkeypatch.setattr(shared_prefix, "_own_block_mask", lambda *args: built.append(args) or real(*args))
        forwards = []
        real_forward = model.model.forward
        monkeypatch.setattr(model.model, "forward", lambda *a, **k: forwards.append(1) or real_forward(*a, **k))
        flex, flex_answers = _answers(model, questions, "flex", entry)
    finally:
        model.continue_tokens = 0
    np.testing.assert_allclose(flex, reference, atol=1e-5)
    assert flex_answers == reference_answers
    layers = model.model.config.get_text_config().num_hidden_layers
    assert layers > 1 and 0 < len(built) <= len(forwards)  # at most one block mask per forward


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_attention_on_cuda_equals_the_cpu_path(dtype):
    """The compiled FlexAttention path on CUDA (prefixes of two lengths, rows folded, padding in the rows' own
    columns) equals the CPU path (float32, CPU flash kernel) within the dtype's rounding."""
    generator = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, columns, length, dim = 6, 8, 2, 24, 24, 64
    prefixes = [[tuple(torch.randn(1, kv_heads, size, dim, generator=generator) for _ in "kv")]
                for size in (40, 40, 33)]
    image_of_row = [0, 1, 1, 0, 2, 2]
    valid = torch.ones(rows, columns, dtype=torch.bool)
    valid[1, 20:] = False
    query = torch.randn(rows, heads, length, dim, generator=generator)
    key, value = (torch.randn(rows, kv_heads, columns, dim, generator=generator) for _ in "kv")

    with shared_prefix_attention(_Config, prefixes, image_of_row, valid):
        expected, _ = _attention(_Layer(), query, key, value, None, scaling=0.125)
    on_cuda = [[tuple(t.to("cuda", dtype) for t in layer) for layer in prefix] for prefix in prefixes]
    with shared_prefix_attention(_Config, on_cuda, image_of_row, valid.cuda()):
        assert shared_prefix.kernel_for(torch.device("cuda")) == "flex"
        ours, _ = _attention(_Layer(), *(t.to("cuda", dtype) for t in (query, key, value)), None, scaling=0.125)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(ours.float().cpu(), expected, atol=tolerance, rtol=tolerance)
    assert not shared_prefix.failed(shared_prefix.FLEX_PART)  # fused and compiled, not a fallback's values


@pytest.mark.gpu
@cuda
def test_tiny_llava_on_cuda_scores_as_on_the_cpu(mixed, tmp_path):
    """A tiny LLaVA (heads of 16, the least compiled FlexAttention takes) in bf16 on CUDA scores as in float32
    on the CPU within bf16 rounding, and in float32 on CUDA within 1e-4."""
    from verbmirage.models import create_model
    from verbmirage.models.tiny import build_tiny_llava

    _, questions = mixed
    path = str(build_tiny_llava(tmp_path / "llava", hidden_size=64))
    cpu = create_model("cpu", {"backend": "llava", "path": path, "local_files_only": True})
    cpu.continue_tokens = 0
    reference, _ = _answers(cpu, questions, None)
    for dtype, tolerance in (("bfloat16", 3e-2), ("float32", 1e-4)):
        gpu = create_model("gpu", {"backend": "llava", "path": path, "device": "cuda", "dtype": dtype,
                                   "local_files_only": True})
        gpu.continue_tokens = 0
        assert gpu.prefix_cache.reads_in_place() and shared_prefix.kernel_for(torch.device("cuda"), 16) == "flex"
        scores, _ = _answers(gpu, questions, None)
        np.testing.assert_allclose(scores, reference, atol=tolerance)
        assert not shared_prefix.failed(shared_prefix.FLEX_PART)  # fused and compiled, not a fallback's values


def test_prefixes_of_one_forward_stack_as_a_view_in_storage_order():
    """The CUDA path reads a block's prefixes, when one forward computed them, as a view of that forward's cache
    (no copy per layer); others are copied. Either way the stack equals their concatenation."""
    from verbmirage.models.hf.shared_prefix import _blocks, _stacked

    cache = torch.randn(4, 2, 5, 8)
    prefixes = [cache[j : j + 1] for j in range(4)]
    view = _stacked(prefixes[1:3])
    assert view.data_ptr() == prefixes[1].data_ptr() and torch.equal(view, torch.cat(prefixes[1:3]))
    every_other = _stacked(prefixes[::2])  # rows 0 and 2 of one cache: a view too
    assert every_other.data_ptr() == prefixes[0].data_ptr() and torch.equal(every_other, torch.cat(prefixes[::2]))
    copied = _stacked([prefixes[2], prefixes[1]])  # out of order: a copy
    assert copied.data_ptr() != prefixes[2].data_ptr() and torch.equal(copied, torch.cat([prefixes[2], prefixes[1]]))
    members = [([(prefixes[2], prefixes[2])], [0, 1]), ([(prefixes[0], prefixes[0])], [2, 3, 4])]
    ordered = _blocks(members, in_storage_order=True)
    assert len(ordered) == 1 and [p[0][0].data_ptr() for p in ordered[0].prefixes] == [
        prefixes[0].data_ptr(), prefixes[2].data_ptr()]
    kept = _blocks(members)  # the CPU path keeps the order its reference results came in
    assert [p[0][0].data_ptr() for p in kept[0].prefixes] == [prefixes[2].data_ptr(), prefixes[0].data_ptr()]


def test_flex_attends_each_prefix_length_in_one_block_as_the_cpu_path():
    """On FlexAttention's path (CUDA's) the prefixes of one length are one block however unevenly their rows
    are spread (the CPU path cuts them where padding costs more than a call), and the attention equals the CPU
    path's within 1e-5."""
    generator = torch.Generator().manual_seed(1)
    rows, heads, kv_heads, length, dim, prefix = 7, 4, 4, 3, 64, 600
    prefixes = [[tuple(torch.randn(1, kv_heads, prefix, dim, generator=generator) for _ in "kv")] for _ in range(3)]
    image_of_row = [0, 1, 1, 1, 1, 1, 2]  # one row, five rows, one row
    query = torch.randn(rows, heads, length, dim, generator=generator)
    key, value = (torch.randn(rows, kv_heads, length, dim, generator=generator) for _ in "kv")

    outputs, blocks = {}, {}
    for kernel in ("cpu_flash", "flex"):
        with use_kernel(kernel), shared_prefix_attention(_Config, prefixes, image_of_row):
            blocks[kernel] = len(shared_prefix._ACTIVE.get().blocks)
            outputs[kernel], _ = _attention(_Layer(), query, key, value, None, scaling=0.125)
    assert blocks["cpu_flash"] > 1 and blocks["flex"] == 1
    torch.testing.assert_close(outputs["flex"], outputs["cpu_flash"], atol=1e-5, rtol=1e-5)


@pytest.fixture
def no_compile_failures(monkeypatch):
    """A clean slate of compile failures (compiled_layers.note_failure) and of compiled FlexAttention and merge,
    before and after the test (dynamo's too: it tries a function that failed in no later test)."""
    from verbmirage.models.hf import compiled_layers

    monkeypatch.setattr(compiled_layers, "_FAILURES", {})
    monkeypatch.setattr(compiled_layers, "_WARNED", set())
    caches = (shared_prefix._compiled_flex, shared_prefix._compiled_merge)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()
    torch._dynamo.reset()


#: how compiled FlexAttention fails: its compilation, raising (as where nothing compiles the layers) or run eagerly
#: instead where dynamo's ``suppress_errors`` is on (a job on a GPU whose layers compile); or its first run
FAILURES = ["compiling", "compiling_suppressed", "running"]


@pytest.mark.parametrize("failure", FAILURES)
def test_compiled_flex_attention_that_fails_attends_plainly_from_then_on(failure, no_compile_failures, monkeypatch,
                                                                         caplog):
    """Where compiled FlexAttention fails (inductor on a GPU or torch it was not tried on: ``compiling``; its
    kernel on its first run: ``running``), the job goes on: that call attends uncompiled, CUDA attends in plain
    products from then on, the log says why once, and the values are the CPU path's within 1e-5."""
    import functools
    import logging

    from verbmirage.models.hf import compiled_layers

    tries = []

    def failing_backend(graph, inputs):
        tries.append(graph)
        raise RuntimeError("no kernel for this GPU")

    def failing_kernel(*args, **kwargs):
        tries.append(args)
        raise RuntimeError("no kernel for this GPU")

    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", failure == "compiling_suppressed")
    if failure.startswith("compiling"):
        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=failing_backend))
    else:
        monkeypatch.setattr(shared_prefix, "_compiled_flex", lambda: failing_kernel)
    generator = torch.Generator().manual_seed(2)
    rows, heads, kv_heads, length, dim = 3, 4, 2, 5, 16
    prefixes = [[tuple(torch.randn(1, kv_heads, size, dim, generator=generator) for _ in "kv")] for size in (9, 9)]
    query = torch.randn(rows, heads, length, dim, generator=generator)
    key, value = (torch.randn(rows, kv_heads, length, dim, generator=generator) for _ in "kv")
    with shared_prefix_attention(_Config, prefixes, [0, 1, 1]):
        expected, _ = _attention(_Layer(), query, key, value, None, scaling=0.25)
    assert shared_prefix.kernel_for(torch.device("cuda"), dim) == "flex"
    tried = []  # what compiled code was tried by the end of each call
    with caplog.at_level(logging.WARNING, logger=compiled_layers.__name__):
        for _call in range(2):
            with use_kernel("flex", compiled=True), shared_prefix_attention(_Config, prefixes, [0, 1, 1]):
                ours, _ = _attention(_Layer(), query, key, value, None, scaling=0.25)
            torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
            tried.append(len(tries))
    assert tried[0] > 0 and tried[1] == tried[0]  # the second call compiled and ran nothing compiled
    assert shared_prefix.kernel_for(torch.device("cuda"), dim) == "plain"
    warned = [r.getMessage() for r in caplog.records if r.name == compiled_layers.__name__]
    assert len(warned) == 1 and "torch.compile failed for FlexAttention" in warned[0], warned
    assert "no kernel for this GPU" in warned[0]
