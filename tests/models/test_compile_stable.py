"""CUDA's compiled code stops compiling once warmed up: the decoder layers (models/hf/compiled_layers.py),
FlexAttention and the attention merge (models/hf/shared_prefix.py), set up on the CPU as on CUDA
(``fit_to_device`` as bench/launches.py sets CUDA's path up, the ``flex`` kernel compiled as on CUDA). After one
call of each kind (scoring one image's questions; greedy continuations, beam search and VCD sampling, each on
several images' YN and MC questions, the MC ones with their shared header), calls of each kind with other sizes
(other question counts, images, suffix lengths, steps) compile no new graph, and answer as the eager CPU path
within 1e-5. (Kept to the kinds that once compiled again, and VCD for the sampling loop and two streams:
OPERA's step reuses beam search's, and each kind costs CI time in tracing.)

On a GPU each new graph costs seconds to tens of seconds, and past the recompile limit a layer runs eagerly; the
compiler here is ``torch.compile`` with the ``eager`` backend: dynamo's graphs and guards, which decide what
compiles again, without generating code (inductor cannot compile a FlexAttention that returns its log-sum-exp
on the CPU, and its code takes minutes to build on two cores)."""

from __future__ import annotations

import functools
import logging

import numpy as np
import pytest
import torch
from PIL import Image

from verbmirage.models import Question, create_model
from verbmirage.models.hf import compiled_layers, shared_prefix
from verbmirage.models.hf.on_device import fit_to_device
from verbmirage.models.tiny import build_tiny_llava
from verbmirage.variants.settings import Variant

VERBS = ("riding", "feeding a very small", "washing", "walking next to", "holding", "kissing the", "petting")
OPTIONS = ("riding", "feeding", "washing", "walking")

#: the kinds of call, each as its variant and its two calls: (image, YN questions, first verb, MC questions) per
#: image; the first call warms the kind up, the second has other sizes
KINDS = {
    "score": ({}, [(0, 4, 0, 0)], [(1, 3, 2, 0)]),
    "greedy": ("continue", [(0, 4, 0, 0), (1, 0, 0, 2), (2, 1, 3, 0)], [(2, 6, 1, 0), (3, 0, 0, 4), (1, 1, 5, 0)]),
    "beam": ({"decoding": "beam", "num_beams": 3, "max_new_tokens": 4}, [(0, 3, 0, 0), (1, 0, 0, 2)],
             [(2, 5, 1, 0), (3, 1, 0, 0), (0, 0, 0, 4)]),
    "vcd": ({"decoding": "sample", "seed": 3, "max_new_tokens": 4, "vcd": {}}, [(0, 3, 0, 0), (1, 0, 0, 2)],
            [(2, 5, 1, 0), (3, 1, 0, 0)]),
}


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny LLaVA with heads of 16 (FlexAttention's path on CUDA) twice: as on the CPU (the reference) and
    set up as on CUDA; images; the compiled code compiled by the ``eager`` backend (caches cleared after)."""
    folder = tmp_path_factory.mktemp("compile_stable")
    path = build_tiny_llava(folder / "llava", hidden_size=64)
    images = []
    for i in range(4):
        images.append(folder / f"img{i}.png")
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(images[-1])
    settings = {"backend": "llava", "path": str(path), "local_files_only": True}
    reference, model = create_model("reference", settings), create_model("tiny_llava", settings)
    caches = (compiled_layers._compiled, shared_prefix._compiled_flex, shared_prefix._compiled_merge)
    # pytest attaches its log capture to every logger that does not propagate, torch's structured trace among
    # them, and torch then writes out each graph it compiles for it (a third of this file's time): detached here
    trace = logging.getLogger("torch.__trace")
    handlers = list(trace.handlers)
    for handler in handlers:
        trace.removeHandler(handler)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
        patch.setattr(trace, "propagate", True)  # and not attached again
        for cache in caches:
            cache.cache_clear()
        torch._dynamo.reset()  # nothing compiled by the tests before: the counts are this file's
        fit_to_device(model, device=torch.device("cuda"))
        yield reference, model, images
    for cache in caches:
        cache.cache_clear()
    torch._dynamo.reset()
    for handler in handlers:
        if handler in logging.getLogger().handlers:  # pytest's that are still in use
            trace.addHandler(handler)


def _call(model, images, variant, parts, compiled: bool):
    questions = []
    for image, yes_no, first, multiple_choice in parts:
        questions += [Question(f"yn{image}_{k}", f"Is the person {VERBS[(first + k) % len(VERBS)]} the horse?",
                               images[image]) for k in range(yes_no)]
        questions += [Question(f"mc{image}_{r}", "Which of the following actions is present in the image?",
                               images[image], OPTIONS[r:] + OPTIONS[:r]) for r in range(multiple_choice)]
    model.use_variant(Variant.from_config({} if variant == "continue" else variant))
    model.continue_tokens = 4 if variant == "continue" else 0
    model.forget_prefixes()
    with shared_prefix.use_kernel("flex" if compiled else "cpu_flash", compiled=compiled):
        return model.score_mixed(questions, [bool(q.options) for q in questions])


def _same_answers(ours, theirs):
    for a, b in zip(ours, theirs, strict=True):
        assert (a.prediction, a.raw_answer) == (b.prediction, b.raw_answer)
        values = [np.atleast_1d(r.option_probs if hasattr(r, "option_probs") else r.p_yes) for r in (a, b)]
        np.testing.assert_allclose(values[0], values[1], atol=1e-5)


@pytest.mark.slow  # about a minute on two cores, nearly all of it dynamo tracing each kind's first call
def test_compiled_code_compiles_nothing_new_once_each_kind_of_call_is_warmed_up(setup):
    reference, model, images = setup
    warm_up, new = {}, {}
    for kind, (variant, first, second) in KINDS.items():
        before = _graphs()
        _same_answers(_call(model, images, variant, first, True), _call(reference, images, variant, first, False))
        warm_up[kind], before = _graphs() - before, _graphs()
        _same_answers(_call(model, images, variant, second, True), _call(reference, images, variant, second, False))
        new[kind] = _graphs() - before
    assert all(warm_up[kind] for kind in ("score", "greedy", "beam")), warm_up  # ran compiled (VCD: on their graphs)
    assert new == dict.fromkeys(KINDS, 0)
    assert compiled_layers.failures() == []  # nothing ran eagerly for a failed compilation


def test_reaching_the_recompile_limit_is_warned_once_naming_the_model(setup, caplog, monkeypatch):
    """Past the recompile limit a compiled layer's new shapes run eagerly: the job's log says so once, naming the
    model and the function (torch's own warning names neither the model nor that it stays eager)."""
    _, model, images = setup
    compiled_layers.compiler_settings()  # sets the limit once: lowered after it
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    torch._dynamo.reset()  # every compiled variant forgotten: the next shapes compile again
    try:
        with caplog.at_level(logging.WARNING, logger=compiled_layers.__name__):
            for parts in ([(0, 2, 0, 0)], [(1, 3, 1, 0)], [(2, 1, 0, 0), (3, 2, 0, 0)]):
                _call(model, images, {}, parts, True)
    finally:
        torch._dynamo.reset()  # nothing left running eagerly for the tests after
    warned = [r.getMessage() for r in caplog.records if r.name == compiled_layers.__name__]
    assert warned and all(m.startswith("tiny_llava: torch.compile reached its recompile_limit (1)") for m in warned)
    assert len(warned) == len(set(warned))  # once per function


def test_a_layer_that_fails_to_compile_runs_eagerly_from_where_it_failed(monkeypatch, caplog):
    """Where inductor fails on a decoder layer's graph (a GPU or torch it was not tried on), the job goes on: the
    layer runs eagerly from where the failure is, so a cache update before it (outside the graphs) runs once, not
    again; the answers are the eager layers'; the log names the model and the function, once. (Within
    ``eager_layers`` nothing compiles.)"""
    import functools
    import logging

    updates, graphs = [], []

    @torch.compiler.disable
    def update(x):  # as a cache's update: between the layer's graphs, outside them
        updates.append(1)
        return x + 1

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.cos(update(torch.sin(self.self_attn(x)))) * 2

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

        def get_decoder(self):
            return self

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    def backend(graph, inputs):  # the layer's first graph compiles, the one after the update fails
        graphs.append(graph)
        if len(graphs) > 1:
            raise RuntimeError("no kernel for this GPU")
        return graph.forward

    monkeypatch.setattr(compiled_layers, "_WARNED", set())
    monkeypatch.setattr(compiled_layers, "_FAILURES", {})
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)  # restored after: set below, as on a GPU
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    model, x = Model(), torch.randn(3, 4)
    expected = model(x)
    assert compiled_layers.compile_decoder_layers(model, device=torch.device("cuda"), name="toy")
    assert torch._dynamo.config.suppress_errors  # a job on a GPU: a failed compilation runs eagerly
    with compiled_layers.eager_layers():  # the benchmarks' generate: transformers' own layers, nothing compiled
        torch.testing.assert_close(model(x), expected)
    assert not graphs
    updates.clear()
    tried = []  # graphs compiled and warnings by the end of each call
    with caplog.at_level(logging.WARNING, logger=compiled_layers.__name__):
        for _ in range(2):
            torch.testing.assert_close(model(x), expected)
            tried.append((len(graphs), len(caplog.records)))
    assert len(updates) == 4  # once per layer and call
    assert tried[0][0] >= 2 and tried[1] == tried[0]  # the second call compiled nothing and warned of nothing
    warned = [r.getMessage() for r in caplog.records if r.name == compiled_layers.__name__]
    assert warned and len(set(warned)) == len(warned)  # once per function
    assert all(m.startswith("toy: torch.compile failed in ") and "(RuntimeError: no kernel for this GPU): it runs "
               "eagerly from there on" in m for m in warned), warned
    assert compiled_layers.failures() == ["the decoder layers"]  # the job's record names it (on_device)
    torch._dynamo.reset()  # dynamo tries a failed function in no later test of this process
