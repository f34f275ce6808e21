"""LLaVA's original conversation format (``conversation: llava_v1``) and one prompt rendering for every path.

On tiny random-weight LLaVA models of the real classes: the rendered tokens, the image token
count, scoring through the engine, and the prompt that ``generate`` really feeds the model.
"""

from __future__ import annotations

import pytest
import torch

from verbmirage.models import Question, create_model
from verbmirage.models.prompts import CONVERSATIONS
from verbmirage.models.tiny import build_tiny_llava

LLAVA_V1_SYSTEM = ("A chat between a curious human and an artificial intelligence assistant. "
                   "The assistant gives helpful, detailed, and polite answers to the human's questions.")


def _llava(path, conversation=None, name="m"):
    entry = {"backend": "llava", "path": str(path), "local_files_only": True}
    if conversation:
        entry["conversation"] = conversation
    return create_model(name, entry)


@pytest.fixture(scope="module")
def geometry_llava(tmp_path_factory):
    """A tiny LLaVA with LLaVA-1.5's image geometry: 336 px, patch 14 -> 576 image tokens."""
    return build_tiny_llava(tmp_path_factory.mktemp("llava336") / "m", image_size=336, patch_size=14)


def test_llava_v1_golden_string():
    """conv_llava_v1.get_prompt() for one user message (image first) and an open assistant turn."""
    question = "Is someone riding a horse?\nAnswer yes or no."
    assert CONVERSATIONS["llava_v1"].render(question, "<image>") == (
        f"{LLAVA_V1_SYSTEM} USER: <image>\nIs someone riding a horse?\nAnswer yes or no. ASSISTANT:"
    )
    assert CONVERSATIONS["vicuna_v1"].render("Q?", "<image>").startswith(
        "A chat between a curious user and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the user's questions. USER: <image>\nQ?"
    )


def test_llava_v1_tokens_and_image_token_count(geometry_llava, images):
    plain, v1 = _llava(geometry_llava), _llava(geometry_llava, "llava_v1")
    question = Question("q", "Is someone riding a horse?", image=images[0])
    text = v1.render(question, multiple_choice=False)
    assert text == f"{LLAVA_V1_SYSTEM} USER: <image>\nIs someone riding a horse?\nAnswer yes or no. ASSISTANT:"
    assert plain.render(question, False) == "USER: <image>\nIs someone riding a horse?\nAnswer yes or no. ASSISTANT:"
    image_id = v1.image_token_id()
    encoded = {name: m.encode([m.render(question, False)], [m.open_image(question.image)]) for name, m in
               (("plain", plain), ("v1", v1))}
    for name, batch in encoded.items():
        assert int((batch["input_ids"][0] == image_id).sum()) == 576, name  # (336 / 14)^2, CLS dropped
    # every other token is the rendered text's own tokenization: the processor only expanded <image>
    ids = encoded["v1"]["input_ids"][0].tolist()
    assert ids == v1.tokenizer(text.replace("<image>", "<image>" * 576))["input_ids"]
    before_image = v1.tokenizer.decode(ids[: ids.index(image_id)], skip_special_tokens=True)
    assert " ".join(before_image.split()) == f"{LLAVA_V1_SYSTEM} USER:"
    # the question part (image onwards) is the same as with the llava-hf template
    tail = lambda batch: batch["input_ids"][0].tolist()[batch["input_ids"][0].tolist().index(image_id):]  # noqa: E731
    assert tail(encoded["v1"]) == tail(encoded["plain"])


def test_llava_v1_scores_equal_an_unbatched_forward(tiny_dirs, images):
    """The system sentence joins the shared prefix; prefix reuse still gives a full forward's numbers."""
    v1, plain = _llava(tiny_dirs["llava"], "llava_v1"), _llava(tiny_dirs["llava"])
    questions = [Question(f"q{i}", f"Is someone {verb} a horse?", image=images[i % 2])
                 for i, verb in enumerate(["riding", "feeding", "washing", "petting"])]
    got = [r.p_yes for r in v1.score_yes_no(questions)]
    for question, p_yes in zip(questions, got):
        encoded = v1.encode([v1.render(question, False)], [v1.open_image(question.image)])
        with torch.inference_mode():
            probs = torch.softmax(v1.model(**encoded).logits[0, -1].float(), -1)
        yes, no = probs[v1._yes_ids].sum(), probs[v1._no_ids].sum()
        assert p_yes == pytest.approx(float(yes / (yes + no)), abs=1e-4)
    assert got != pytest.approx([r.p_yes for r in plain.score_yes_no(questions)], abs=1e-6)  # the format matters


def _first_forward_ids(model, question: Question) -> list[int]:
    """The input ids of the first forward pass that ``model.generate`` runs (a real hook, no stand-in)."""
    seen = []

    def hook(module, args, kwargs):
        if not seen:
            seen.append(kwargs["input_ids"][0].tolist())

    handle = model.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model.generate([question], max_new_tokens=2)
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("conversation", [None, "llava_v1"])
def test_generate_feeds_the_same_rendering_as_scoring(tiny_dirs, images, conversation):
    model = _llava(tiny_dirs["llava"], conversation)
    question = Question("free", "Describe the image.", image=images[1])
    expected = model.encode([model.render(question, None)], [model.open_image(question.image)])["input_ids"][0]
    ids = _first_forward_ids(model, question)
    assert ids == expected.tolist()
    text = model.tokenizer.decode(ids, skip_special_tokens=True)
    assert text.startswith("A chat between a curious human") == (conversation == "llava_v1")
    assert "Describe the image." in text and "Answer yes or no" not in text  # free text: no answer instruction


def test_conversation_setting_is_checked(tiny_dirs):
    with pytest.raises(ValueError, match=r"models.m.conversation: 'llava_v2' is not one of"):
        _llava(tiny_dirs["llava"], "llava_v2")
    with pytest.raises(ValueError, match=r"models.q.conversation: 'llava_v1' is not one of \['chat_template'\] "
                                         r"for backend 'qwen2_vl'"):
        create_model("q", {"backend": "qwen2_vl", "path": str(tiny_dirs["qwen2_vl"]), "local_files_only": True,
                           "conversation": "llava_v1"})


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "qwen2_5_vl"])
def test_chat_template_frame_renders_like_the_template(tiny_dirs, family):
    """Prompts are the template's frame around the text: equal to apply_chat_template on YN, MC (line breaks)
    and free text; a template that changes the text is used as is."""
    entry = {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True}
    model = create_model("m", entry)
    texts = ["Is someone riding a horse?\nAnswer yes or no.", "What is the person doing with the bicycle?\n"
             "A. repairing\nB. riding\nC. washing\nD. carrying\nAnswer with the option's letter.", "Describe it.",
             " padded text \n"]
    assert model.inputs._chat_frame() is not None
    for text in texts:
        assert model.render_turn(text) == model.inputs._chat_turn(text), text

    model.processor.chat_template = "USER: <image>{{ messages[0]['content'][1]['text'] | upper }} ASSISTANT:"
    model.inputs._frame = False  # find the frame again
    assert model.inputs._chat_frame() is None
    assert model.render_turn(texts[0]) == "USER: <image>IS SOMEONE RIDING A HORSE?\nANSWER YES OR NO. ASSISTANT:"
