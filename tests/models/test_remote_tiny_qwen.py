"""Qwen-VL-Chat end to end on a tiny random-weight model built from the checkpoint's own code.

The model and its tokenizer (the real ``qwen.tiktoken``) come from
``../shared/remote_code/qwen_vl_chat``; the adapter runs them through the
worker in the environment ``configs/paper.yaml`` names. Golden strings and ids
are those of the official chat code (``make_context`` + ``from_list_format``).
"""

from __future__ import annotations

import math
import os

import pytest
from PIL import Image

from remote_tiny import (
    check_batches_equal_one_at_a_time,
    check_memory_geometry,
    TRANSFORMERS5_ENV,
    check_beam_and_sampling,
    check_scores,
    first_greedy_answer,
    module_images,
    module_model,
    require_env,
    tiny_entry,
)
from verbmirage.models import Question, create_model

SYSTEM_HEADER_IDS = [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198]
ASSISTANT_TAIL_IDS = [151645, 198, 151644, 77091, 198]
IM_START, IMG, IMG_END, IMG_PAD = 151644, 151857, 151858, 151859
YES_IDS = {"Yes": 9454, " Yes": 7414, "yes": 9693, " yes": 9834}
NO_IDS = {"No": 2753, " No": 2308, "no": 2152, " no": 902}
NOT_NO = {"ności": 44323, "ność": 71619}


def golden_prompt(image: str, question: str) -> str:
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            f"Picture 1:<img>{image}</img>\n{question}<|im_end|>\n<|im_start|>assistant\n")


qwen = module_model("qwen_vl_chat")
images = module_images("qwen_images", [((64, 48), (200, 30, 30)), ((64, 48), (20, 180, 40))])


def test_constructor_scans_the_real_vocabulary(qwen):
    """the lone <img> and the padding rows 151860-151935 do not decode; the scan still finds the answers."""
    assert len(qwen.vocabulary) == 151936 and qwen.tokenizer_size == 151860
    assert qwen.vocabulary[IMG] is None and all(t is None for t in qwen.vocabulary[151860:])
    assert qwen.vocabulary[IM_START] == "<|im_start|>"
    assert set(YES_IDS.values()) <= set(qwen._yes_ids) and set(NO_IDS.values()) <= set(qwen._no_ids)
    assert not set(NOT_NO.values()) & set(qwen._no_ids)  # S4
    assert {32, 362} <= set(qwen._letter_ids[0]) and {33, 425} <= set(qwen._letter_ids[1])
    assert qwen.environment["transformers"] == "4.32.0"
    assert "modeling_qwen.py" in qwen.code and "qwen_generation_utils.py" in qwen.code


def test_prompt_equals_the_official_chat_code(qwen, images, tmp_path, monkeypatch):
    """make_context's text and ids; a relative image path reaches the tokenizer absolute."""
    monkeypatch.chdir(images[0].parent)
    question = Question("q", "Is someone riding a horse?", image=images[0].name)
    text = qwen.prompt_text(question, multiple_choice=False)
    assert text == golden_prompt(str(images[0]), "Is someone riding a horse?\nAnswer yes or no.")
    ids = qwen.client.request("prompt", image=str(images[0]), prompt="Is someone riding a horse?")["ids"]
    assert ids[: len(SYSTEM_HEADER_IDS)] == SYSTEM_HEADER_IDS and ids[-len(ASSISTANT_TAIL_IDS):] == ASSISTANT_TAIL_IDS
    start = ids.index(IMG)
    path_bytes = list(str(images[0]).encode())
    assert ids[start + 1 : start + 1 + len(path_bytes)] == path_bytes  # the path as raw byte ids
    assert ids[start + 1 + len(path_bytes) : start + 257] == [IMG_PAD] * (256 - len(path_bytes))
    assert ids[start + 257] == IMG_END


def test_yes_no_and_multiple_choice_scores(qwen, images):
    check_scores(qwen, images, images[0], ("riding", "feeding", "washing"))


def test_logits_argmax_is_the_first_greedy_token(qwen, images):
    """The scored position is the one generation starts from, and decoding is greedy and reproducible."""
    prompt = "Is someone riding a horse?\nAnswer yes or no."
    for image in images:
        first = first_greedy_answer(qwen, image, prompt)
        official = qwen.client.request("reference", image=str(image), prompt=prompt, max_new_tokens=3)
        assert official["ok"], official
        assert first["text"].startswith(official["text"].strip())  # chat() drops the last token at max_new_tokens


def test_text_answers_and_overlong_paths(qwen, images, tmp_path):
    text = qwen.generate([Question("g", "Describe the image.", image=images[1])], max_new_tokens=3)
    assert isinstance(text[0], str)
    deep = tmp_path / ("d" * 120) / ("e" * 120)
    deep.mkdir(parents=True)
    long_image = deep / "image.png"
    Image.new("RGB", (8, 8)).save(long_image)
    results = qwen.score_yes_no([Question("long", "Is it?", image=long_image), Question("ok", "Is it?", image=images[0])])
    assert "shorter than 256 UTF-8 bytes" in results[0].error and str(long_image) in results[0].error
    assert results[1].error is None and not math.isnan(results[1].p_yes)
    assert os.path.isabs(str(images[0]))


def test_in_process_path_on_transformers5_equals_the_official_stack(qwen, images):
    """The drivers' 5.x patches (the in-process path), run in a transformers 5.24 env, give the worker env's
    numbers: before them, 5.24 re-drew every c_proj.weight after loading and left masked_bias unset."""
    env5 = require_env(TRANSFORMERS5_ENV)
    patched = create_model("qwen5", tiny_entry("qwen_vl_chat", env5, qwen.path, max_new_tokens=3))
    try:
        assert patched.environment["transformers"].startswith("5.")
        questions = [Question(str(i), "Is someone riding a horse?", image=p) for i, p in enumerate(images)]
        for official, ours in zip(qwen.score_yes_no(questions), patched.score_yes_no(questions)):
            assert ours.error is None and ours.p_yes == pytest.approx(official.p_yes, abs=1e-4)
            assert ours.raw_answer == official.raw_answer
        prompt = "Is someone riding a horse?\nAnswer yes or no."
        reference = qwen.client.request("generate", image=str(images[0]), prompt=prompt, max_new_tokens=3)
        assert patched.client.request("generate", image=str(images[0]), prompt=prompt,
                                      max_new_tokens=3)["token_ids"] == reference["token_ids"]
    finally:
        patched.close()


def test_beam_search_and_sampling_are_the_checkpoints_own(qwen, images):
    check_beam_and_sampling(qwen, images[0])


def test_batches_answer_as_one_question_at_a_time(qwen, images):
    """Scores on one image prefix per image, and decoding: left-padded rows through its generate (its rotary positions count the padding: a shift that leaves attention unchanged)."""
    check_batches_equal_one_at_a_time(qwen, images)


def test_the_driver_reports_what_the_batch_sizing_reads(qwen, images):
    check_memory_geometry(qwen, images[0])
