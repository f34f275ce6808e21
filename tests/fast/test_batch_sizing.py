"""A job's batch sized from the device's memory (verbmirage.inference.sizing), read through a fake reading: the
arithmetic, the record kept with a job's answers, and the CPU's unchanged default."""

from __future__ import annotations

import json

import pytest

from verbmirage.inference.sizing import (
    AUTO,
    BATCH_STEP,
    DEFAULT_BATCH_SIZE,
    MARGIN,
    MAX_BATCH,
    DeviceMemoryError,
    choose_batching,
    rows_per_image,
    sized_batch,
)
from verbmirage.inference.store import FINGERPRINT, PartStore
from verbmirage.models import create_model
from verbmirage.models.memory import MemoryCosts

GIB, MIB = 2**30, 2**20
H200 = 140 * GIB


def _needs(costs: MemoryCosts, batch: int, per_image_rows: float) -> float:
    """What a call of ``batch``-row forwards holds, as the sizing counts it."""
    return batch * (costs.per_row + costs.call_batches * costs.per_question) + \
        (costs.call_batches * batch / per_image_rows + 1) * costs.per_image


def _usable(free: int, total: int) -> float:
    return free - MARGIN * total


@pytest.mark.parametrize("costs, free, rows", [
    (MemoryCosts(weights=14 * GIB, per_row=140 * MIB, per_image=500 * MIB, call_batches=4), 126 * GIB, 20.0),
    (MemoryCosts(weights=14 * GIB, per_row=560 * MIB, per_image=500 * MIB), 126 * GIB, 20.0),  # beam search
    (MemoryCosts(weights=14 * GIB, per_row=1100 * MIB, per_image=1000 * MIB), 126 * GIB, 20.0),  # VCD + beams
    (MemoryCosts(weights=14 * GIB, per_row=140 * MIB, per_image=500 * MIB, call_batches=4), 60 * GIB, 1.0),
    (MemoryCosts(weights=2 * GIB, per_row=3 * MIB, per_image=9 * MIB, call_batches=4), 20 * GIB, 7.5),
    # a decoding whose call decodes its batches together: each question holds its rows for the whole call
    (MemoryCosts(weights=14 * GIB, per_row=40 * MIB, per_question=130 * MIB, per_image=500 * MIB, call_batches=4),
     126 * GIB, 20.0),
])
def test_the_sized_batch_is_the_largest_multiple_of_eight_whose_call_fits(costs, free, rows):
    batch = sized_batch(costs, free, H200, rows)
    assert 1 <= batch <= MAX_BATCH and (batch % BATCH_STEP == 0 or batch & (batch - 1) == 0 and batch < BATCH_STEP)
    assert _needs(costs, batch, rows) <= _usable(free, H200)  # fits, the margin kept free
    step = BATCH_STEP if batch >= BATCH_STEP else batch
    assert batch == MAX_BATCH or _needs(costs, batch + step, rows) > _usable(free, H200)  # the next size would not


def test_below_eight_rows_the_sized_batch_is_a_power_of_two():
    costs = MemoryCosts(weights=14 * GIB, per_row=1 * GIB, per_image=0)
    assert [sized_batch(costs, int(MARGIN * H200) + n * GIB + GIB // 2, H200) for n in (1, 3, 7, 8, 13)] == \
        [1, 2, 4, 8, 8]


def test_more_free_memory_fewer_beams_and_more_questions_per_image_give_larger_batches():
    greedy = MemoryCosts(weights=14 * GIB, per_row=140 * MIB, per_image=500 * MIB, call_batches=4)
    beams = MemoryCosts(weights=14 * GIB, per_row=5 * 140 * MIB, per_image=500 * MIB)
    assert sized_batch(greedy, 120 * GIB, H200, 20) > sized_batch(greedy, 40 * GIB, H200, 20)
    assert sized_batch(greedy, 120 * GIB, H200, 20) > sized_batch(beams, 120 * GIB, H200, 20)
    assert sized_batch(greedy, 120 * GIB, H200, 30) > sized_batch(greedy, 120 * GIB, H200, 1)


def test_the_sized_batch_is_capped():
    tiny = MemoryCosts(weights=MIB, per_row=1000, per_image=4000, call_batches=4)
    assert sized_batch(tiny, H200, H200, 30) == MAX_BATCH
    assert sized_batch(tiny, H200, H200, 30, cap=256) == 256


@pytest.mark.parametrize("per_row, rows, batch", [
    (608 * MIB, 15.0, 32),   # LLaVA-1.5-7B in bf16, beam-5 in calls of one batch: 40 would pass the budget
    (1217 * MIB, 15.0, 16),  # VCD with beam-5
    (192 * MIB, 33.0, 104),  # sampling, many questions per image
])
def test_a_decodings_batch_stops_at_its_budget_however_much_is_free(per_row, rows, batch):
    """A decoding's costs carry a budget (weights included): on an H200 with 126 GiB free its sized batch is the
    largest whose call and weights fit 40 GiB less the margin, where the free memory alone would fit four to
    eight times more."""
    costs = MemoryCosts(weights=int(13.2 * GIB), per_row=per_row, per_image=497 * MIB, budget=40 * GIB)
    unbounded = MemoryCosts(weights=costs.weights, per_row=per_row, per_image=costs.per_image)
    sized = sized_batch(costs, 126 * GIB, H200, rows)
    assert sized == batch and sized_batch(unbounded, 126 * GIB, H200, rows) >= 4 * batch
    within = (1 - MARGIN) * 40 * GIB
    assert costs.weights + _needs(costs, sized, rows) <= within < costs.weights + _needs(costs, sized + 8, rows)
    assert sized_batch(costs, 20 * GIB, H200, rows) == sized_batch(unbounded, 20 * GIB, H200, rows)  # less free


def test_a_budget_smaller_than_the_weights_still_leaves_one_question_where_the_device_holds_it():
    """A model too large for the budget (weights of 60 GiB) decodes one question per forward, not none."""
    costs = MemoryCosts(weights=60 * GIB, per_row=600 * MIB, per_image=500 * MIB, budget=40 * GIB)
    assert sized_batch(costs, 60 * GIB, H200, 10.0) == 1


def test_a_device_that_cannot_hold_one_question_fails_naming_the_model_the_batch_and_the_memory():
    costs = MemoryCosts(weights=14 * GIB, per_row=600 * MIB, per_image=500 * MIB, device="cuda:0")
    free = int(MARGIN * 16 * GIB + GIB)  # one GiB past the margin: less than a question and its image
    with pytest.raises(DeviceMemoryError) as raised:
        sized_batch(costs, free, 16 * GIB, 1.0, name="llava15_7b")
    message = str(raised.value)
    for words in ("llava15_7b", "batch of 1", "cuda:0", "1.07 GiB", "2.60 GiB free of 16.00 GiB", "weights hold 14.00"):
        assert words in message, message


def test_rows_per_image_counts_on_the_images_with_fewest_questions():
    images = ["a"] * 30 + ["b"] * 30 + ["c"] * 2
    assert rows_per_image(images) == pytest.approx(7.6)  # the 10th percentile of (2, 30, 30)
    assert rows_per_image(["a"]) == 1.0 and rows_per_image([]) == 1.0


def test_the_batching_kept_with_a_stores_answers_goes_when_its_fingerprint_changes(tmp_path):
    store = PartStore(tmp_path / "parts", "first")
    assert store.batching is None
    record = {"batch_size": 256, "per_call": 1024, "source": "sized", "measured": {"free_bytes": 1}}
    store.keep_batching(record)
    store.append([{"question_id": "q1", "raw_answer": "yes", "prediction": "yes", "parse_rule": "first_token",
                   "p_yes": 0.9, "option_probs": None, "confidence": 0.9, "error": None}])
    store.close()
    again = PartStore(tmp_path / "parts", "first")  # a resume: the same fingerprint keeps parts and batching
    assert again.batching == record and len(again.rows()) == 1
    assert json.loads((tmp_path / "parts" / FINGERPRINT).read_text())["fingerprint"] == "first"
    again.use_fingerprint("second")  # other settings: the parts and the sizes they were asked with go
    assert again.batching is None and again.rows().empty
    again.close()


def test_on_the_cpu_auto_is_the_old_default_and_nothing_is_recorded():
    """Without a device reading (the CPU) a job answers as it always has: batch 64, nothing kept or stamped; a
    number in the config wins."""
    model = create_model("random", {"backend": "random", "seed": 0})
    chosen = choose_batching(model, AUTO, None, ["a", "b"])
    assert (chosen.batch_size, chosen.per_call, chosen.record) == (DEFAULT_BATCH_SIZE, DEFAULT_BATCH_SIZE, None)
    assert choose_batching(model, 8, None, ["a"]).batch_size == 8


def test_a_backend_without_memory_costs_keeps_the_default_on_a_gpu_and_says_so(caplog):
    """A fake reading stands for a GPU: a backend that cannot tell its memory (the random baseline, an API, a
    driver that reports nothing) is not sized."""
    model = create_model("random", {"backend": "random", "seed": 0})
    with caplog.at_level("INFO"):
        chosen = choose_batching(model, AUTO, None, ["a"], memory=lambda: (100 * GIB, H200))
    assert chosen.batch_size == DEFAULT_BATCH_SIZE and chosen.record is None
    assert "gives no memory costs" in caplog.text


#: What each remote-code driver reports (``Driver.memory_geometry``) for the paper's checkpoints in bf16: the
#: language model's config, one image at its largest (Qwen-VL-Chat's 256 pooled tokens; MiniCPM-Llama3-V-2.5's ten
#: slices of 96; Molmo's thirteen crops of 12 x 13; mPLUG-Owl2's 64 queries) and its vision tower.
REMOTE_GEOMETRIES = {
    "qwen_vl_chat": dict(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=22016,
                         vocab=151936, image_tokens=258, vision_tokens=1024, vision_layers=48, vision_hidden=1664,
                         weights=int(19.3 * GIB)),
    "minicpm_v": dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256,
                      image_tokens=980, vision_tokens=10240, vision_layers=27, vision_hidden=1152,
                      weights=int(16.0 * GIB)),
    "molmo": dict(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, intermediate=37888, vocab=152064,
                  image_tokens=2030, vision_tokens=7501, vision_layers=24, vision_hidden=1024,
                  weights=int(15.0 * GIB)),
    "mplug_owl2": dict(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=11008, vocab=32000,
                       image_tokens=65, vision_tokens=1025, vision_layers=24, vision_hidden=1024,
                       weights=int(15.6 * GIB)),
}


@pytest.mark.parametrize("name", sorted(REMOTE_GEOMETRIES))
def test_a_remote_code_models_costs_hold_its_whole_prompts_cache_and_grow_with_beams(name):
    from verbmirage.models.memory import HEADER_TOKENS, SUFFIX_TOKENS, remote_memory_costs

    geometry = {**REMOTE_GEOMETRIES[name], "itemsize": 2}
    greedy = remote_memory_costs(geometry, "cuda:0", beams=1, new_tokens=8)
    beams = remote_memory_costs(geometry, "cuda:0", beams=5, new_tokens=8)
    per_token = 2 * geometry["layers"] * geometry["kv_heads"] * geometry["head_dim"] * 2
    prompt = geometry["image_tokens"] + HEADER_TOKENS + SUFFIX_TOKENS
    # a row's forward returns its cache over the whole prompt (the prefix copied); the checkpoint's generate runs
    # the prompt once per beam, each beam's cache held twice at a step's peak; an image holds its prefix's cache
    assert greedy.per_row > 2 * per_token * prompt
    assert beams.per_row == 5 * greedy.per_row
    assert greedy.per_image > per_token * (geometry["image_tokens"] + HEADER_TOKENS)
    assert greedy.call_batches == 1 and greedy.weights == geometry["weights"]
    free = H200 - geometry["weights"]
    assert sized_batch(beams, free, H200, 20) < sized_batch(greedy, free, H200, 20) <= MAX_BATCH
    assert sized_batch(beams, free, H200, 20) >= 4  # a 7B checkpoint's beam-5 still batches on one H200


def test_a_resume_on_a_gpu_that_computes_otherwise_keeps_the_sizes_and_says_so(monkeypatch, caplog):
    """The record kept with a job's answers names its GPU and the kernels chosen for it (``device_path``); a
    resume on the same kind keeps the record as it was, one on a GPU whose generation attends otherwise keeps
    the sizes and says what differs, in the log and in the record; a record kept before devices were named says
    nothing."""
    model = create_model("random", {"backend": "random", "seed": 0})
    costs = MemoryCosts(weights=14 * GIB, per_row=140 * MIB, per_image=500 * MIB, device="cuda:0")
    h200 = {"gpu": "NVIDIA H200", "capability": "9.0", "attention": "flex", "compiled_layers": True}
    v100 = {**h200, "gpu": "Tesla V100-SXM2-32GB", "capability": "7.0", "attention": "plain"}
    monkeypatch.setattr(model, "memory_costs", lambda: costs)
    path = h200
    monkeypatch.setattr(model, "device_path", lambda: path)
    first = choose_batching(model, AUTO, None, ["a"] * 20, memory=lambda: (120 * GIB, H200)).record
    assert first["device"] == h200
    with caplog.at_level("WARNING"):
        assert choose_batching(model, AUTO, first, ["a"] * 20, memory=lambda: (130 * GIB, H200)).record is first
        assert not caplog.records
        path = v100
        moved = choose_batching(model, AUTO, first, ["a"] * 20, memory=lambda: (130 * GIB, H200)).record
    assert (moved["batch_size"], moved["per_call"], moved["device"]) == (first["batch_size"], first["per_call"], v100)
    assert "attention flex -> plain" in moved["note"] and "capability 9.0 -> 7.0" in moved["note"]
    assert moved["note"] in caplog.text
    older = {key: value for key, value in first.items() if key != "device"}
    assert choose_batching(model, AUTO, older, ["a"] * 20, memory=lambda: (130 * GIB, H200)).record is older
    noted = {**first, "note": "the answers kept from an earlier run were asked at batch 128"}  # an earlier note
    again = choose_batching(model, AUTO, noted, ["a"] * 20, memory=lambda: (130 * GIB, H200)).record
    assert again["note"].startswith(noted["note"] + "; ") and again["note"].endswith(moved["note"])
