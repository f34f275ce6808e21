"""CLIP backend on a tiny random-weight CLIPModel with a CLIPTokenizer trained offline."""

import math

import pytest
import torch

from verbmirage.models import Question, create_model


@pytest.fixture(scope="module")
def clip(tiny_dirs):
    return create_model("clip", {"backend": "clip", "path": str(tiny_dirs["clip"]), "local_files_only": True,
                                 "threshold": 0.0})


def _similarity(clip, image, caption) -> float:
    from PIL import Image

    with Image.open(image) as img:
        pixels = clip.processor(images=[img.convert("RGB")], return_tensors="pt")["pixel_values"]
    tokens = clip.processor(text=[caption], return_tensors="pt")
    with torch.inference_mode():
        a = clip.model.get_image_features(pixel_values=pixels).pooler_output
        b = clip.model.get_text_features(**tokens).pooler_output
    return float(torch.nn.functional.cosine_similarity(a, b)[0])


def test_captions(clip):
    assert clip.caption(Question("a", "", verb="sit_on", object="bench")) == "a photo of a person sitting on a bench"
    assert clip.caption(Question("b", "", verb="hold")) == "a photo of a person holding something"
    assert clip.caption(Question("c", "", object="umbrella")) == "a photo of an umbrella"
    assert clip.caption(Question("d", ""), option="riding a horse") == "a photo of a person riding a horse"


def test_braces_in_a_template_other_than_caption_are_text(tiny_dirs, images):
    """``{}`` or ``{0}`` beside ``{caption}`` used to fail every question (str.format), on every rerun."""
    model = create_model("clip", {"backend": "clip", "path": str(tiny_dirs["clip"]), "local_files_only": True,
                                  "template": "a photo of {caption} {} {0} {{x}}"})
    assert model.caption(Question("c", "", object="umbrella")) == "a photo of an umbrella {} {0} {{x}}"
    (result,) = model.score_yes_no([Question("c", "", image=str(images[0]), object="umbrella")])
    assert result.error is None


def test_yes_no_is_thresholded_similarity(clip, images):
    questions = [Question(f"q{i}", "", image=images[i % 3], verb=v, object="horse")
                 for i, v in enumerate(["ride", "feed", "wash", "hold", "walk"])]
    results = clip.score_yes_no(questions)
    for question, result in zip(questions, results):
        similarity = _similarity(clip, question.image, clip.caption(question))
        assert result.raw_answer == f"similarity={similarity:.4f}"
        assert result.p_yes == pytest.approx(1 / (1 + math.exp(-clip.logit_scale * similarity)), abs=1e-4)
        assert result.prediction == ("yes" if similarity >= 0 else "no")
    # batching does not change a score
    alone = [clip.score_yes_no([q])[0].p_yes for q in questions]
    assert [r.p_yes for r in results] == pytest.approx(alone, abs=1e-5)


def test_multiple_choice_is_softmax_over_captions(clip, images):
    options = ("riding a horse", "feeding a horse", "washing a horse", "walking a horse")
    result = clip.score_multiple_choice([Question("m", "", image=images[0], options=options)])[0]
    sims = torch.tensor([_similarity(clip, images[0], clip.caption(Question("m", ""), o)) for o in options])
    expected = torch.softmax(clip.logit_scale * sims, dim=0)
    assert result.option_probs == pytest.approx(tuple(expected.tolist()), abs=1e-4)
    assert result.prediction == "ABCD"[int(expected.argmax())]


def test_unreadable_image(clip, tmp_path, images):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"nope")
    results = clip.score_yes_no([Question("a", "", image=bad, verb="ride", object="horse"),
                                 Question("b", "", image=images[0], verb="ride", object="horse")])
    assert "bad.jpg" in results[0].error and results[1].error is None


def test_the_tiny_clip_is_the_same_in_every_build(tiny_dirs, tmp_path):
    """Built again in another process (another hash seed): the same files, so the demo's CLIP answers do not
    depend on which machine or run built it (the BPE trainer once numbered its tokens differently each time)."""
    import hashlib
    import os
    import subprocess
    import sys

    script = "import sys; from verbmirage.models.tiny import build_tiny_clip; build_tiny_clip(sys.argv[1])"
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "again")], check=True, capture_output=True,
                   env={**os.environ, "PYTHONHASHSEED": "123"})

    def digests(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}

    assert digests(tmp_path / "again") == digests(tiny_dirs["clip"])
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(tiny_dirs["clip"])
    pieces = tokenizer.tokenize("a photo of a person riding a horse")
    assert pieces[0] == "a</w>" and "horse</w>" in pieces  # a real CLIP BPE: words end in </w>
