"""MiniCPM-Llama3-V-2.5 end to end on a tiny random-weight model built from the checkpoint's own code.

Code, processor and tokenizer config come from
``../shared/remote_code/minicpm_llama3_v2_5``; the checkpoint ships no
``tokenizer.json``, so the tiny model gets a small byte-level BPE with Llama
3's special tokens at their real ids. Logits come from the model's own vision
embedding followed by the language model on ``inputs_embeds``.
"""

from __future__ import annotations


from remote_tiny import check_batches_equal_one_at_a_time, check_memory_geometry, check_beam_and_sampling, check_scores, first_greedy_answer, module_images, module_model
from verbmirage.models import Question

BEGIN, START_HEADER, END_HEADER, EOT = 128000, 128006, 128007, 128009
IMAGE, IMAGE_END, UNK = 128010, 128011, 128002
QUERY_TOKENS = 96  # config.query_num: one <unk> placeholder per resampler query


def golden_prompt(question: str) -> str:
    return ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n(<image>./</image>)\n"
            f"{question}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


minicpm = module_model("minicpm_v")
images = module_images("minicpm_images", [((64, 48), (200, 30, 30)), ((300, 120), (20, 180, 40))])


def test_constructor_and_vocabulary(minicpm):
    """C3 (resampler imports on a current torch), C4 (loads), the scan over the stand-in Llama-3 vocabulary."""
    assert len(minicpm.vocabulary) == 128256 and minicpm.vocabulary[EOT] == "<|eot_id|>"
    assert {minicpm.vocabulary[i] for i in minicpm._yes_ids} == {"Yes", " Yes", "yes", " yes"}
    assert {minicpm.vocabulary[i] for i in minicpm._no_ids} == {"No", " No", "no", " no"}
    assert {minicpm.vocabulary[i] for i in minicpm._letter_ids[0]} == {"A", " A"}
    assert "modeling_minicpmv.py" in minicpm.code and "resampler.py" in minicpm.code


def test_prompt_equals_the_official_chat(minicpm, images):
    question = Question("q", "Is someone riding a horse?", image=images[0])
    assert minicpm.prompt_text(question, multiple_choice=False) == golden_prompt(
        "Is someone riding a horse?\nAnswer yes or no.")
    ids = minicpm.client.request("prompt", image=str(images[0]), prompt="Is someone riding a horse?")["ids"]
    tail = ids[ids.index(EOT):]  # <|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n
    assert ids[:2] == [BEGIN, START_HEADER] and tail[:2] == [EOT, START_HEADER] and END_HEADER in tail[2:]
    start = ids.index(IMAGE)
    assert ids[start + 1 : start + 1 + QUERY_TOKENS] == [UNK] * QUERY_TOKENS and ids[start + 1 + QUERY_TOKENS] == IMAGE_END


def test_yes_no_and_multiple_choice_scores(minicpm, images):
    """p_yes and confidence come from logits, not from a parsed reply."""
    check_scores(minicpm, images, images[1], ("riding", "feeding"))


def test_logits_argmax_is_the_first_greedy_token_and_chat_agrees(minicpm, images):
    """greedy unless asked; the checkpoint's own chat() (processor passed once) gives the same text."""
    prompt = "Is someone riding a horse?\nAnswer yes or no."
    for image in images:
        first = first_greedy_answer(minicpm, image, prompt)
        official = minicpm.client.request("reference", image=str(image), prompt=prompt, max_new_tokens=3)
        assert official["ok"] and official["text"] == first["text"]
    beams = minicpm.client.request("generate", image=str(images[0]), prompt=prompt, max_new_tokens=2, num_beams=3,
                                   repetition_penalty=1.2)
    assert beams["ok"] and beams["decoding"] == "beam3-rp1.2"


def test_beam_search_and_sampling_are_the_checkpoints_own(minicpm, images):
    check_beam_and_sampling(minicpm, images[0])


def test_batches_answer_as_one_question_at_a_time(minicpm, images):
    """Scores on one image prefix per image, and decoding: left-padded rows through its generate, image bounds shifted with them."""
    check_batches_equal_one_at_a_time(minicpm, images)


def test_the_driver_reports_what_the_batch_sizing_reads(minicpm, images):
    check_memory_geometry(minicpm, images[0])
