"""What the engine does differently on CUDA (models/hf/on_device.py): fewer, fuller forwards, compiled decoder
layers (models/hf/compiled_layers.py) and OPERA's step in one forward (its answers: tests/models/test_opera.py).
They are set up on the CPU here as on CUDA: the fuller forwards must score
as the CPU's cuts within float32 rounding (the compiled layers' results, and that they compile nothing new once
warmed up: tests/models/test_compile_stable.py); on CUDA (``pytest -m gpu``, bench/h200_check.sh) the layers
compiled by inductor must score as the eager ones within bf16 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verbmirage.models import Question, create_model
from verbmirage.models.hf.compiled_layers import ENV
from verbmirage.models.hf.on_device import (CUDA_FORWARD_COST, FORWARD_COST_ENV, OPERA_ONE_FORWARD_ENV,
                                            fit_to_device)
from verbmirage.models.tiny import build_tiny_llava

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _questions(folder, image: int = 0):
    """Four YN questions of one random image (``image``: its seed)."""
    from PIL import Image

    path = folder / f"img{image}.png"
    Image.fromarray(np.random.default_rng(image).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(path)
    return [Question(f"yn{image}_{i}", f"Is the person {verb} the horse?", path)
            for i, verb in enumerate(("riding", "feeding a very small", "washing", "walking next to"))]


def _scores(model, questions, keep_prefixes: bool = False):
    if not keep_prefixes:
        model.forget_prefixes()
    results = model.score_yes_no(questions)
    return np.array([r.p_yes for r in results]), [r.raw_answer for r in results]


def _wrapped(model) -> list[bool]:
    """Per decoder layer, whether it runs through compiled_layers' dispatch."""
    return ["forward" in vars(layer) for layer in model.model.get_decoder().layers]


@pytest.fixture(scope="module")
def tiny_llava_path(tmp_path_factory):
    return build_tiny_llava(tmp_path_factory.mktemp("tiny") / "llava")


def _llava(path):
    model = create_model("tiny_llava", {"backend": "llava", "path": str(path), "local_files_only": True})
    model.continue_tokens = 0
    return model


def test_cuda_forwards_are_fewer_and_score_as_the_cpu_cuts(tiny_llava_path, tmp_path, monkeypatch):
    """On the CPU nothing is set up; set up as on CUDA (layers left eager by the switch), the YN and MC prompts
    of two images run in fewer language-model forwards (suffix batches packed fuller, no header forward) and
    score as with the CPU's cuts within 1e-5; the switch keeps the layers eager."""
    model = _llava(tiny_llava_path)
    fit_to_device(model)  # its own device, the CPU: nothing changes
    assert (model.prefix_cache.BATCH_COST, model.prefix_cache.HEADER_SAVING) == (256, 32) and not any(_wrapped(model))
    assert not model.opera_one_forward  # OPERA's two forwards per step
    questions = _questions(tmp_path, 0) + _questions(tmp_path, 1)
    verbs = ["riding", "feeding", "washing", "walking"]
    questions += [Question(f"mc{q.question_id}_{r}", "Which of the following actions is present in the image?",
                           q.image, tuple(verbs[r:] + verbs[:r])) for q in questions[::4] for r in range(4)]
    flags = [bool(q.options) for q in questions]
    forwards = []
    model.model.get_decoder().register_forward_pre_hook(lambda *_: forwards.append(1))

    def scores():
        forwards.clear()
        model.forget_prefixes()
        results = model.score_mixed(questions, flags)
        values = [r.option_probs if hasattr(r, "option_probs") else r.p_yes for r in results]
        return np.concatenate([np.atleast_1d(v) for v in values]), len(forwards)

    reference, cpu_forwards = scores()
    monkeypatch.setenv(ENV, "0")
    fit_to_device(model, device=torch.device("cuda"))
    assert (model.prefix_cache.BATCH_COST, model.prefix_cache.HEADER_SAVING) == (CUDA_FORWARD_COST, CUDA_FORWARD_COST)
    assert not any(_wrapped(model))
    ours, cuda_forwards = scores()
    assert cuda_forwards < cpu_forwards
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert model.opera_one_forward  # OPERA's step in one forward; its switch turns it off
    monkeypatch.setenv(OPERA_ONE_FORWARD_ENV, "0")
    fit_to_device(model, device=torch.device("cuda"))
    assert not model.opera_one_forward
    monkeypatch.setenv(FORWARD_COST_ENV, "512")  # a forward's cost set for the GPU at hand
    fit_to_device(model, device=torch.device("cuda"))
    assert (model.prefix_cache.BATCH_COST, model.prefix_cache.HEADER_SAVING) == (512, 512)
    for wrong in ("lots", "0"):
        monkeypatch.setenv(FORWARD_COST_ENV, wrong)
        with pytest.raises(ValueError, match=f"VERBMIRAGE_FORWARD_COST='{wrong}': expected a whole number"):
            fit_to_device(model, device=torch.device("cuda"))


def _compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.mark.gpu
@cuda
def test_compiled_decoder_layers_on_cuda_score_as_eager_ones(tmp_path, monkeypatch):
    """A tiny LLaVA (heads of 16: FlexAttention's path) in bf16 on CUDA compiles its decoder layers by default and
    scores as with ``VERBMIRAGE_COMPILE_LAYERS=0`` within bf16 rounding."""
    for variable, folder in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        monkeypatch.setenv(variable, str(tmp_path / folder))  # the compilers' files stay here
    torch._dynamo.reset()  # what the GPU tests before it compiled (the same tiny shapes) would compile nothing new
    path = str(build_tiny_llava(tmp_path / "llava", hidden_size=64))
    questions = _questions(tmp_path)
    settings = {"backend": "llava", "path": path, "device": "cuda", "dtype": "bfloat16", "local_files_only": True}
    monkeypatch.setenv(ENV, "0")
    eager = create_model("eager", settings)
    eager.continue_tokens = 0
    assert not any(_wrapped(eager))
    reference, _ = _scores(eager, questions)
    monkeypatch.delenv(ENV)
    compiled = create_model("compiled", settings)
    compiled.continue_tokens = 0
    assert all(_wrapped(compiled))
    graphs = _compiled_graphs()
    scores, _ = _scores(compiled, questions)
    assert _compiled_graphs() > graphs
    np.testing.assert_allclose(scores, reference, atol=3e-2)
    from verbmirage.models.hf.compiled_layers import failures

    assert failures() == []  # compiled, not run eagerly after a failed compilation
