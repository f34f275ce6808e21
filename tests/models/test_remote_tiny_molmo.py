"""Molmo-7B-D end to end on a tiny random-weight model built from the checkpoint's own code.

Code, tokenizer (vocab.json + merges.txt + added_tokens.json) and processor
come from ``../shared/remote_code/molmo_7b_d``; the vision tower is shrunk in
the tiny copy (its sizes are written in ``MolmoForCausalLM.__init__``). The
adapter runs it through the worker in the env ``configs/paper.yaml`` names.
Golden ids are the official processor's (``" User: " + text + " Assistant:"``).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from remote_tiny import (
    BATCH_QUESTIONS,
    REPO,
    check_batches_equal_one_at_a_time,
    check_memory_geometry,
    TRANSFORMERS5_ENV,
    check_beam_and_sampling,
    check_scores,
    envs_dir,
    first_greedy_answer,
    module_images,
    module_model,
    require_env,
    tiny_entry,
    worker_env,
)
from verbmirage.models import Question, create_model

BOS = 151643  # <|endoftext|>, prepended by the processor (the tokenizer has no bos_token)
IMAGE_TOKENS = {152064, 152065, 152066, 152067, 152068}  # <im_start> <im_end> <im_patch> <im_col> <im_low>
TEXT_IDS = [2657, 25, 2160, 4325, 19837, 264, 15223, 30, 21388, 25]  # " User: Is someone riding a horse? Assistant:"
YES_IDS, NO_IDS = {7414, 9454, 9834}, {2308, 902}
LETTER_IDS = {"A": 362, "B": 425}


molmo = module_model("molmo")
images = module_images("molmo_images", [((64, 48), (200, 30, 30)), ((40, 90), (20, 180, 40))])


def test_constructor_and_vocabulary(molmo):
    """M3 (loads), S5 (tokenizer 152069 > logits 152064: ids past the logits are not scanned)."""
    assert len(molmo.vocabulary) == 152064 and molmo.tokenizer_size == 152069
    assert YES_IDS <= set(molmo._yes_ids) and NO_IDS <= set(molmo._no_ids)
    assert LETTER_IDS["A"] in molmo._letter_ids[0] and LETTER_IDS["B"] in molmo._letter_ids[1]
    assert "modeling_molmo.py" in molmo.code and molmo.environment["transformers"]


def test_prompt_equals_the_official_processor(molmo, images):
    question = Question("q", "Is someone riding a horse?", image=images[0])
    reply = molmo.client.request("prompt", image=str(images[0]), prompt="Is someone riding a horse?")
    ids = reply["ids"]
    assert ids[0] == BOS and ids[-len(TEXT_IDS):] == TEXT_IDS
    assert set(ids[1 : -len(TEXT_IDS)]) <= IMAGE_TOKENS  # image tokens first, then the text
    assert reply["text"].startswith("<|endoftext|><im_start>")
    assert molmo.prompt_text(question, multiple_choice=False).endswith(
        "<im_end> User: Is someone riding a horse?\nAnswer yes or no. Assistant:")


def test_scores_in_bfloat16_weights(molmo, images, tmp_path_factory):
    """float32 pixels meet bfloat16 weights; the driver casts them as the model card does."""
    env = worker_env("molmo")
    bf16 = create_model("molmo_bf16", tiny_entry("molmo", env, molmo.path, dtype="bfloat16"))
    try:
        assert bf16.loaded_dtype == "bfloat16"  # the dtype reaches from_pretrained on 4.x (torch_dtype=)
        results = bf16.score_yes_no([Question("1", "Is someone riding a horse?", image=images[0])])
        assert results[0].error is None and 0.0 < results[0].p_yes < 1.0
    finally:
        bf16.close()


def test_yes_no_and_multiple_choice_scores(molmo, images):
    check_scores(molmo, images, images[1], ("riding", "feeding"))


def test_logits_argmax_is_the_first_greedy_token(molmo, images):
    """generate_from_batch runs, greedy and reproducible, starting from the scored position."""
    for image in images:
        first_greedy_answer(molmo, image)
    text = molmo.generate([Question("g", "Describe it.", image=images[0])], max_new_tokens=3)
    assert isinstance(text[0], str)


def test_in_process_path_on_transformers5_scores_like_the_official_stack(molmo, images):
    """M3 patched: Molmo loads on transformers 5.24 and its logits equal the worker env's; text decoding there
    is refused with a message that names the worker env (M4 is not patched)."""
    env5 = require_env(TRANSFORMERS5_ENV)
    patched = create_model("molmo5", tiny_entry("molmo", env5, molmo.path))
    try:
        assert patched.environment["transformers"].startswith("5.")
        questions = [Question(str(i), "Is someone riding a horse?", image=p) for i, p in enumerate(images)]
        for official, ours in zip(molmo.score_yes_no(questions), patched.score_yes_no(questions)):
            assert ours.error is None and ours.p_yes == pytest.approx(official.p_yes, abs=1e-4)
        reply = patched.client.request("generate", image=str(images[0]), prompt="Is it?", max_new_tokens=2)
        assert not reply["ok"] and "env: remote-molmo" in reply["error"]
    finally:
        patched.close()


def test_sampling_runs_and_beam_search_is_refused(molmo, images):
    """Molmo's generate_from_batch cannot run beam search (its caches have no reordering): a beam variant is
    refused, naming what the backend lacks; sampling is its own generate's."""
    from verbmirage.variants.settings import Variant

    with pytest.raises(ValueError, match=r"backend 'molmo' .* lacks \['decoding:beam'\]"):
        molmo.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 5}))
    check_beam_and_sampling(molmo, images[0], beams=False)


def test_batches_answer_as_one_question_at_a_time(molmo, images):
    """Scores on one image prefix per image, and decoding: generate_from_batch on right-padded rows of one image (greedy: it has no beam search)."""
    check_batches_equal_one_at_a_time(molmo, images, beams=None)


# run in the worker env: the driver's batch inputs against its processor's, counting the image processor's calls
# with the benchmark's counter (bench/remote_batching.py)
BATCH_INPUTS = """
import json, sys
sys.path[:0] = sys.argv[1], sys.argv[5]
from remote_driver import _open_rgb
from remote_drivers import DRIVERS
from remote_batching import _count_image_preprocessing
driver = DRIVERS["molmo"](sys.argv[2], dtype="float32", device="cpu")
path, questions = sys.argv[3], json.loads(sys.argv[4])
whole = [driver.processor.process(images=[_open_rgb(path)], text=q)["input_ids"].tolist() for q in questions]
calls = _count_image_preprocessing(driver)
ids, state = driver.batch_inputs(path, questions)
found = {"equal": ids == whole, "state": sorted(state), "calls": [len(calls)]}
# a processor whose text step cannot be read, and one whose text tokens are not the split's: each question whole
for settings in (None, {"message_format": "none", "always_start_with_space": False}):
    calls.clear()
    driver._text_kwargs = settings
    fallback, _ = driver.batch_inputs(path, questions)
    found["calls"].append(len(calls))
    found[f"fallback_equal_{settings is not None}"] = fallback == whole
print(json.dumps(found))
"""


def test_an_images_crops_are_made_once_for_all_its_questions(molmo, images):
    """A batch's ids are the processor's for each question whole, with the image's crops made once for all of
    them (its image processor runs once, not once per question); where the processor's text step cannot be read,
    or its tokens are not what follows the image, every question is processed whole, to the same ids."""
    python = envs_dir() / worker_env("molmo") / "bin" / "python"
    questions = [question + "\nAnswer yes or no." for question in BATCH_QUESTIONS]
    out = subprocess.run([str(python), "-c", BATCH_INPUTS, str(REPO / "src" / "verbmirage" / "models"),
                          str(molmo.path), str(images[0]), json.dumps(questions), str(REPO / "bench")], capture_output=True, text=True,
                         timeout=300, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert found == {"equal": True, "fallback_equal_False": True, "fallback_equal_True": True,
                     "calls": [1, len(questions), len(questions)],
                     "state": ["image_input_idx", "image_masks", "images", "input_ids"]}, found


def test_the_driver_reports_what_the_batch_sizing_reads(molmo, images):
    check_memory_geometry(molmo, images[0])
