"""Suffix batches that read their cached prefixes in place (models/hf/shared_prefix.py), shared text headers
(PrefixCache._text_headers) and where suffix batches are cut (cheapest_cuts): the same scores as giving
every row its own copy of its whole prompt."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from PIL import Image

from verbmirage.models import Question, create_model
from verbmirage.models.hf.shared_prefix import KERNELS, _attention, cheapest_cuts, shared_prefix_attention, use_kernel


class _Layer(torch.nn.Module):
    layer_idx = 0


@pytest.mark.parametrize("kernel", KERNELS)  # the CPU's, CUDA's (FlexAttention, here eager) and other devices'
def test_attention_on_shared_prefixes_equals_attention_on_each_rows_whole_sequence(kernel):
    generator = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, length, dim = 5, 4, 2, 6, 8
    prefixes = [[tuple(torch.randn(1, kv_heads, size, dim, generator=generator) for _ in "kv")] for size in (7, 7)]
    image_of_row = [0, 1, 1, 0, 1]
    query = torch.randn(rows, heads, length, dim, generator=generator)
    key, value = (torch.randn(rows, kv_heads, length, dim, generator=generator) for _ in "kv")

    class Config:
        _attn_implementation_internal = "sdpa"

    with use_kernel(kernel), shared_prefix_attention(Config, prefixes, image_of_row):
        ours, _ = _attention(_Layer(), query, key, value, None, scaling=0.3)
    for row, image in enumerate(image_of_row):
        prefix_keys, prefix_values = prefixes[image][0]
        keys = torch.cat([prefix_keys[0], key[row]], dim=1).repeat_interleave(heads // kv_heads, 0)
        values = torch.cat([prefix_values[0], value[row]], dim=1).repeat_interleave(heads // kv_heads, 0)
        mask = torch.ones(length, 7 + length, dtype=torch.bool)
        mask[:, 7:] = torch.ones(length, length, dtype=torch.bool).tril()
        expected = torch.nn.functional.scaled_dot_product_attention(query[row], keys, values, attn_mask=mask,
                                                                    scale=0.3)
        torch.testing.assert_close(ours[row].transpose(0, 1), expected, atol=1e-5, rtol=1e-5)
    assert Config._attn_implementation_internal == "sdpa"  # restored after the block


@pytest.fixture(scope="module")
def llava(tiny_dirs, tmp_path_factory):
    model = create_model("tiny_llava", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
    model.continue_tokens = 0
    folder = tmp_path_factory.mktemp("headers")
    paths = []
    for i in range(2):
        paths.append(folder / f"img{i}.png")
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(paths[-1])
    verbs = ["riding", "feeding", "washing", "walking"]
    questions = []
    for i, path in enumerate(paths):
        for rotation in range(4):
            options = tuple(verbs[rotation:] + verbs[:rotation])
            questions.append(Question(f"mc{i}_{rotation}", "Which of the following actions is present in the "
                                      "image?", path, options))
    return model, questions


def _owner(model, name: str):
    """Where a setting lives: the prefix cache's tuning (BATCH_COST, HEADER_SAVING, ...) or the family's."""
    return model.prefix_cache if hasattr(type(model.prefix_cache), name) else model


def _scores(model, questions, **settings):
    for name, value in settings.items():
        setattr(_owner(model, name), name, value)
    try:
        model.forget_prefixes()
        return np.array([result.option_probs for result in model.score_multiple_choice(questions)])
    finally:
        for name in settings:
            delattr(_owner(model, name), name)


def test_prompts_of_two_images_score_alike_with_prefixes_in_place_or_copied(llava):
    model, questions = llava
    assert model.prefix_cache.reads_in_place()
    in_place = _scores(model, questions)
    copied = _scores(model, questions, shared_prefix_attention=False)
    np.testing.assert_allclose(in_place, copied, atol=1e-5)
    alone = _scores(model, questions[:1], shared_prefix_attention=False, HEADER_SAVING=10**9)
    np.testing.assert_allclose(in_place[:1], alone, atol=1e-5)


def test_an_mc_question_header_is_cached_once_per_image_and_changes_no_score(llava):
    model, questions = llava
    suffixes = [torch.tensor([5, 6, 7, 8, 9, 1, 2]), torch.tensor([5, 6, 7, 8, 9, 3, 2]),
                torch.tensor([5, 6, 7, 8, 4, 4]), torch.tensor([1, 2, 3])]
    cache = model.prefix_cache
    cache.HEADER_SAVING, cache.HEADER_LENGTH = 4, 4
    try:
        assert cache._text_headers(suffixes) == [4, 4, 4, 0]  # the shared start, not the 5th token of two
    finally:
        del cache.HEADER_SAVING, cache.HEADER_LENGTH
    with_headers = _scores(model, questions)
    lengths = {len(key[1]) for key in cache._prefixes}
    assert len(cache._prefixes) == 4 and len(lengths) == 2  # per image: its prefix, and it with the header
    without = _scores(model, questions, HEADER_SAVING=10**9)
    assert len(cache._prefixes) == 2
    np.testing.assert_allclose(with_headers, without, atol=1e-5)


def _padded_cost(lengths: list[int], cuts: list[int], batch_cost: int) -> int:
    bounds = [0] + cuts + [len(lengths)]
    return sum((stop - start) * lengths[stop - 1] + batch_cost for start, stop in zip(bounds[:-1], bounds[1:]))


def _batch_rows(length: int, cuts: list[int]) -> list[int]:
    bounds = [0] + cuts + [length]
    return [stop - start for start, stop in zip(bounds[:-1], bounds[1:])]


def test_suffix_batches_are_cut_where_a_search_of_every_cut_finds_the_least_work():
    generator = random.Random(0)
    for _ in range(300):
        lengths = sorted(generator.randint(1, 40) for _ in range(generator.randint(1, 8)))
        batch_cost = generator.choice([0, 3, 32, 1000])
        max_rows = generator.choice([None, 1, 2, 3, 5])
        cuts = cheapest_cuts(lengths, batch_cost, max_rows)
        assert cuts == sorted(set(cuts)) and all(0 < cut < len(lengths) for cut in cuts)
        assert max_rows is None or max(_batch_rows(len(lengths), cuts)) <= max_rows
        every = [list(chosen) for k in range(len(lengths))
                 for chosen in itertools.combinations(range(1, len(lengths)), k)
                 if max_rows is None or max(_batch_rows(len(lengths), list(chosen))) <= max_rows]
        least = min(_padded_cost(lengths, other, batch_cost) for other in every)
        assert _padded_cost(lengths, cuts, batch_cost) == least
    assert cheapest_cuts([10, 10, 10, 30, 30, 30], 5) == [3]  # short and long prompts apart
    assert cheapest_cuts([10, 10, 10, 30, 30, 30], 1000) == []  # one forward is worth the padding
    assert cheapest_cuts([10, 10, 10, 30, 30, 30], 1000, max_rows=2) == [2, 4]  # ... unless rows are capped


def test_scores_do_not_depend_on_where_suffix_batches_are_cut(llava, monkeypatch):
    model, questions = llava
    questions = questions + [Question(q.question_id + "_long", q.prompt + " Look at the horse and the bike.",
                                      q.image, q.options) for q in questions[:3]]
    sizes = []
    suffix_batch = model.prefix_cache.suffix_batch
    monkeypatch.setattr(model.prefix_cache, "suffix_batch", lambda opened, batch: sizes.append(len(batch)) or
                        suffix_batch(opened, batch))
    apart = _scores(model, questions, BATCH_COST=0)
    cut_apart, sizes[:] = list(sizes), []
    together = _scores(model, questions, BATCH_COST=10**6)
    assert len(cut_apart) > len(sizes)  # the same rows, cut into more batches
    for score, other in zip(apart, together):
        np.testing.assert_allclose(score, other, atol=1e-5)


def test_a_greedy_call_holds_several_batches_and_each_forward_at_most_one(llava, monkeypatch):
    """use_batch_size: a greedy LLaVA call takes CALL_BATCHES batches' worth of questions, its suffix batches
    and its continuations stay within batch_rows, and the answers are those of an uncapped call."""
    from verbmirage.variants.settings import Variant

    model, questions = llava
    sizes, chunks = [], []
    shrinking, kept_opening = model.with_shrinking_batches, model.decoder.kept_opening
    monkeypatch.setattr(model.decoder, "kept_opening", lambda opened, batch, *rest: sizes.append(len(batch)) or
                        kept_opening(opened, batch, *rest))  # a scoring batch that opens greedy continuations
    monkeypatch.setattr(model, "with_shrinking_batches", lambda method, items, size=None, **kw: chunks.append(size)
                        or shrinking(method, items, size, **kw))
    model.continue_tokens = 4  # undecided answers decode (random weights: many)
    try:
        assert model.use_batch_size(3) == 3 * model.CALL_BATCHES and model.batch_rows == 3
        model.forget_prefixes()
        capped = model.score_multiple_choice(questions)
        assert sizes and max(sizes) <= 3
        decoded = [size for size in chunks if size is not None]  # the decodings' chunks (scoring passes None)
        assert decoded and max(decoded) <= 3  # continuations a batch at a time (the memory estimate's count)
        model.batch_size, sizes[:] = None, []
        model.forget_prefixes()
        whole = model.score_multiple_choice(questions)
        assert max(sizes) > 3  # the same call in fewer, larger forwards
        for a, b in zip(capped, whole):
            np.testing.assert_allclose(a.option_probs, b.option_probs, atol=1e-5)
            assert (a.prediction, a.raw_answer) == (b.prediction, b.raw_answer)
    finally:
        model.use_variant(Variant())
        model.batch_size, model.continue_tokens = None, 0


@pytest.mark.parametrize("settings", [{"decoding": "beam", "num_beams": 2}, {"decoding": "sample", "seed": 3},
                                      {"decoding": "sample", "seed": 3, "vcd": {}}], ids=["beam2", "sample", "vcd"])
def test_a_decodings_call_holds_several_batches_and_steps_all_its_questions_together(llava, monkeypatch, settings):
    """Rows that read their prefixes in place hold only their own columns, so a decoding's call (beam search,
    sampling, VCD) also takes CALL_BATCHES batches' worth of questions: each scoring forward at most one batch
    (with VCD, of both streams), then every question of the call in each step forward (a job of 8 questions at batch 3 steps once per token,
    not once per call of 3), answering as each question alone."""
    from verbmirage.models.hf.steppers import InPlaceStepper
    from verbmirage.variants.settings import Variant

    model, questions = llava
    variant = Variant.from_config({**settings, "max_new_tokens": 3})
    forwards, steps = [], []
    kept_opening, advance = model.decoder.kept_opening, InPlaceStepper.advance
    monkeypatch.setattr(model.decoder, "kept_opening", lambda opened, batch, *rest: forwards.append(len(batch)) or
                        kept_opening(opened, batch, *rest))
    monkeypatch.setattr(InPlaceStepper, "advance", lambda self, tokens: steps.append(len(tokens)) or
                        advance(self, tokens))
    try:
        model.use_variant(variant)
        per_call = model.use_batch_size(3)
        assert per_call == 3 * model.CALL_BATCHES and model.batch_rows == 3
        model.forget_prefixes()
        together = [answer for start in range(0, len(questions), per_call)
                    for answer in model.score_multiple_choice(questions[start : start + per_call])]
        streams = 2 if "vcd" in settings else 1
        # the scoring forwards: one batch of at most 3 questions each, VCD's clean and noised rows together
        assert sum(forwards) == len(questions) * streams and max(forwards) <= 3 * streams
        assert len(forwards) == -(-len(questions) // 3)
        rows = len(questions) * variant.num_beams * streams
        assert steps and set(steps) == {rows}  # each step: every beam of every question, both VCD streams
        model.batch_size = None
        model.forget_prefixes()
        for question, answer in zip(questions, together):
            alone = model.score_multiple_choice([question])[0]
            assert (answer.prediction, answer.raw_answer) == (alone.prediction, alone.raw_answer)
            np.testing.assert_allclose(answer.option_probs, alone.option_probs, atol=1e-5)
    finally:
        model.use_variant(Variant())
        model.batch_size = None


@pytest.mark.parametrize("kernel", KERNELS)
def test_attention_on_own_columns_with_padding_sees_only_each_rows_real_keys(kernel):
    """A decoding step (RowCache): the queries are the last columns of each row's own keys, some of whose earlier
    columns are padding (``valid`` False); the result equals attention on the prefix and the real keys alone."""
    generator = torch.Generator().manual_seed(1)
    rows, heads, kv_heads, columns, length, dim = 4, 4, 2, 9, 2, 8
    prefixes = [[tuple(torch.randn(1, kv_heads, size, dim, generator=generator) for _ in "kv")] for size in (5, 5)]
    image_of_row = [1, 0, 1, 1]
    valid = torch.ones(rows, columns, dtype=torch.bool)
    valid[0, 3:7] = False  # row 0: 3 prompt columns, 4 of padding, then its 2 decoded ones
    valid[2, 1:7] = False
    query = torch.randn(rows, heads, length, dim, generator=generator)
    key, value = (torch.randn(rows, kv_heads, columns, dim, generator=generator) for _ in "kv")

    class Config:
        _attn_implementation_internal = "sdpa"

    with use_kernel(kernel), shared_prefix_attention(Config, prefixes, image_of_row, valid):
        ours, _ = _attention(_Layer(), query, key, value, None, scaling=0.3)
    for row, image in enumerate(image_of_row):
        real = torch.nonzero(valid[row]).flatten()
        prefix_keys, prefix_values = prefixes[image][0]
        keys = torch.cat([prefix_keys[0], key[row][:, real]], dim=1).repeat_interleave(heads // kv_heads, 0)
        values = torch.cat([prefix_values[0], value[row][:, real]], dim=1).repeat_interleave(heads // kv_heads, 0)
        mask = torch.ones(length, keys.shape[1], dtype=torch.bool)
        mask[0, -1] = False  # the first query does not see the second (causal)
        expected = torch.nn.functional.scaled_dot_product_attention(query[row], keys, values, attn_mask=mask,
                                                                    scale=0.3)
        torch.testing.assert_close(ours[row].transpose(0, 1), expected, atol=1e-5, rtol=1e-5)


#: OPERA, its end token raised by 0.7 (below): one image's 4 questions are done after 4 of the 6 steps, the other
#: image's after the last (near the edge: at 0.6 no question is done before the last step, at 0.8 all together)
OPERA_ENDING = {"decoding": "opera", "num_beams": 2, "opera": {"num_attn_candidates": 3, "reward_tokens": 2}}


@pytest.mark.parametrize("settings, boost, one_forward", [
    ({"decoding": "sample", "seed": 3, "vcd": {}}, 2.0, False),
    ({"decoding": "beam", "num_beams": 2, "vcd": {}}, 1.0, False),
    (OPERA_ENDING, 0.7, False), (OPERA_ENDING, 0.7, True),
], ids=["vcd_sample", "vcd_beam", "opera", "opera_one_forward"])  # (each search alone: tests/fast/test_strategies.py)
def test_answers_that_end_leave_the_step_forwards(llava, monkeypatch, settings, boost, one_forward):
    """With the end token made likelier (its output bias raised), answers end at different steps: a step forward
    feeds only the rows still answering (beam search: the beams of the questions that can still improve; VCD:
    of both streams, stepping joined; OPERA: the beams of the questions whose result is not yet taken, probed and
    fed, also in CUDA's one forward per step, forced here), and every answer equals its question's decoded
    alone."""
    from verbmirage.models.hf.steppers import InPlaceStepper
    from verbmirage.variants.settings import Variant

    model, questions = llava
    steps, probes, own_forwards = [], [], []
    advance, probe, fed_by_probe = InPlaceStepper.advance, InPlaceStepper.probe, InPlaceStepper._fed_by_probe
    monkeypatch.setattr(InPlaceStepper, "advance", lambda self, tokens: steps.append(len(tokens)) or
                        advance(self, tokens))
    monkeypatch.setattr(InPlaceStepper, "probe", lambda self, candidates: probes.append(len(candidates)) or
                        probe(self, candidates))

    def fed_from_probe(self, tokens):  # None: the step runs a forward of its own
        logits = fed_by_probe(self, tokens)
        own_forwards.append(logits is None)
        return logits

    monkeypatch.setattr(InPlaceStepper, "_fed_by_probe", fed_from_probe)
    monkeypatch.setattr(model, "opera_one_forward", one_forward)
    head = model.model.get_output_embeddings()
    bias = torch.zeros(head.out_features)
    bias[model.tokenizer.eos_token_id] = boost
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    try:
        model.use_variant(Variant.from_config({**settings, "max_new_tokens": 6}))
        model.forget_prefixes()
        together = model.score_multiple_choice(questions)
        rows = len(questions) * (2 if "vcd" in settings else 1) * settings.get("num_beams", 1)
        assert steps[0] == rows and steps[-1] < rows and steps == sorted(steps, reverse=True), steps
        if settings["decoding"] == "opera":  # probed as fed, and fed from the probe in one forward per step
            assert probes[1:] == steps and own_forwards == [not one_forward] * len(steps), (probes, own_forwards)
        for question, answer in zip(questions, together):
            model.forget_prefixes()
            alone = model.score_multiple_choice([question])[0]
            assert (answer.prediction, answer.raw_answer) == (alone.prediction, alone.raw_answer)
            np.testing.assert_allclose(answer.option_probs, alone.option_probs, atol=1e-5)
    finally:
        head.bias = None
        model.use_variant(Variant())


@pytest.mark.parametrize("entry", [
    {"decoding": "greedy"},
    {"decoding": "beam", "num_beams": 3, "max_new_tokens": 5},
    {"decoding": "sample", "seed": 3, "max_new_tokens": 5, "vcd": {}},
    {"decoding": "opera", "num_beams": 2, "max_new_tokens": 5, "opera": {"num_attn_candidates": 3}},
], ids=["greedy", "beam", "sample_vcd", "opera"])
def test_decoding_on_prefixes_read_in_place_equals_decoding_on_copies(llava, monkeypatch, entry):
    """InPlaceStepper (each prefix read as cached, rows holding only their own columns, joined across scoring
    batches and prefix lengths, buffers grown past their reserve) decodes the answers that PrefixStepper
    (a copy of the prefix per row) decodes: YN and MC of two images, with and without a text header. OPERA
    too: its rows joined in place (one attention column where the decoded tokens start) against its rows on
    copies, each scoring batch apart, with eager attention's weights."""
    from verbmirage.models.hf.steppers import InPlaceStepper
    from verbmirage.variants.settings import Variant

    model, questions = llava
    questions = questions + [Question(f"yn{i}", f"Is the person {verb} the horse?", questions[i].image)
                             for i, verb in zip((0, 5, 2), ("riding", "feeding a very small", "washing"))]
    flags = [bool(q.options) for q in questions]
    real_init = InPlaceStepper.__init__
    made = []

    def small_reserve(self, *args, reserve=8):  # one decoded token of room: the buffers must grow
        made.append(self)
        real_init(self, *args, reserve=1)

    monkeypatch.setattr(InPlaceStepper, "__init__", small_reserve)
    joined, real_joined = [], InPlaceStepper.joined.__func__
    monkeypatch.setattr(InPlaceStepper, "joined", classmethod(lambda cls, picks, *times: joined.append(
        len({id(stepper) for stepper, _ in picks})) or real_joined(cls, picks, *times)))
    model.continue_tokens, model.prefix_cache.BATCH_COST = 4, 0
    model.use_variant(Variant.from_config(entry))
    try:
        model.forget_prefixes()
        in_place = model.score_mixed(questions, flags)
        assert made  # the decodings ran on prefixes read in place
        # every question decoded (not greedy's few undecided ones): rows of several scoring batches in one
        # stepper, OPERA's too (one prefix length here)
        assert entry["decoding"] == "greedy" or max(joined, default=0) > 1, joined
        copied = _mixed(model, questions, flags, shared_prefix_attention=False)
    finally:
        model.use_variant(Variant())
        model.continue_tokens = 0
        del model.prefix_cache.BATCH_COST
    assert [r.raw_answer for r in in_place] == [r.raw_answer for r in copied]
    assert any(len(r.raw_answer) > 1 for r in in_place)  # answers decoded past their first token
    for ours, theirs in zip(in_place, copied):
        assert ours.prediction == theirs.prediction


def test_a_steppers_opening_logits_go_once_its_rows_move(llava):
    """``first`` holds the opening's logits row by row; once a decoding step moves the rows (beams reordered) they
    no longer match, so both prefix steppers drop them (a later join or subset would read stale rows)."""
    model, questions = llava
    image = model.open_image(questions[0].image)
    items = [(questions[0].image, image, model.render(q, False)) for q in questions[:2]]
    for in_place in (True, False):
        model.shared_prefix_attention = in_place
        try:
            with torch.inference_mode():  # as the engine decodes (its cached prefixes are inference tensors)
                first, stepper = model.decoder.open_stepper(items, 2, model.strategy)
                assert type(stepper).__name__ == ("InPlaceStepper" if in_place else "PrefixStepper")
                assert stepper.first.shape[0] == 4 and torch.equal(stepper.first[0], stepper.first[1])  # repeated
                stepper.advance(first.argmax(dim=-1))
                stepper.reorder(torch.tensor([1, 1, 3, 2]))
            assert stepper.first is None
        finally:
            del model.shared_prefix_attention


def test_a_copied_prefix_batch_of_two_prefix_lengths_is_refused(llava):
    """Rows that copy their prefix share one cache width, so a batch of two prefix lengths (an image's, and it
    with an MC question's shared header) would decode on wrong columns: it is refused, naming the lengths."""
    model, questions = llava
    image = model.open_image(questions[0].image)
    mc = [q for q in questions if q.options and q.image == questions[0].image][:2]
    items = [(q.image, image, model.render(q, True)) for q in mc]
    items.append((questions[0].image, image, model.render(Question("yn", "Is the person riding?", questions[0].image),
                                                          False)))
    model.shared_prefix_attention, model.prefix_cache.HEADER_SAVING = False, 1  # two MC prompts share their header
    try:
        with torch.inference_mode():
            opened = model.prefix_cache.open_rows(items, False)
            assert len({opened.prefix_length[i] for i in range(3)}) == 2  # the header's rows, the plain row
            with pytest.raises(ValueError, match=r"one prefix length, not \[\d+, \d+\]"):
                model.decoder.prefix_stepper(opened, [0, 1, 2], model.strategy)
    finally:
        del model.shared_prefix_attention, model.prefix_cache.HEADER_SAVING
        model.forget_prefixes()


def _mixed(model, questions, flags, **settings):
    for name, value in settings.items():
        setattr(_owner(model, name), name, value)
    try:
        model.forget_prefixes()
        return model.score_mixed(questions, flags)
    finally:
        for name in settings:
            delattr(_owner(model, name), name)


def test_without_prefix_reuse_decodings_run_on_whole_prompts_and_answer_alike(tiny_dirs, llava):
    """``prefix_reuse: false`` on LLaVA: no prefix is read in place (whole prompts, OPERA's attention from eager
    attention and its hook, beams at most a batch's rows), and beam search and OPERA answer as with reuse."""
    from verbmirage.variants.settings import Variant

    _, questions = llava
    entries = [{"decoding": "beam", "num_beams": 2, "max_new_tokens": 3},
               {"decoding": "opera", "num_beams": 2, "max_new_tokens": 3, "opera": {"num_attn_candidates": 2}}]
    answers = {}
    for reuse in (True, False):
        model = create_model("tiny_llava", {"backend": "llava", "path": str(tiny_dirs["llava"]),
                                            "local_files_only": True, "prefix_reuse": reuse})
        assert model.prefix_cache.reads_in_place() == reuse
        for entry in entries:
            model.use_variant(Variant.from_config(entry))
            answers[reuse, entry["decoding"]] = [r.raw_answer for r in model.score_multiple_choice(questions)]
        assert (not model.last_attention.kept) == reuse
    for entry in entries:
        assert answers[True, entry["decoding"]] == answers[False, entry["decoding"]]


def test_vcd_scores_its_noised_images_in_the_forwards_of_the_clean_ones(llava):
    """VCD's second stream (the noised images) joins the clean one's forwards: its prefixes run in the clean
    prefixes' batch and its rows in the clean rows' suffix batches, so VCD's scoring pass runs as many forwards
    of the model as greedy's, and its contrast is that of each stream scored alone."""
    from verbmirage.variants.settings import Variant

    model, questions = llava
    calls = []
    hook = model.model.register_forward_pre_hook(lambda module, args: calls.append(module))
    try:
        counts, logits = {}, {}
        for name, variant in {"greedy": Variant(), "vcd": Variant.from_config({"vcd": {}})}.items():
            model.use_variant(variant)
            model.forget_prefixes()
            calls.clear()
            logits[name] = model.answer_logits(questions, True)[0]
            counts[name] = len(calls)
        assert counts["vcd"] == counts["greedy"] > 0
        items = model.inputs.open_items(questions, [model.render(q, True) for q in questions], new_call=True)[1]
        model.forget_prefixes()
        with torch.inference_mode():
            alone = [model._prefix_logits(items, streams=(noised,))[0] for noised in (False, True)]
        contrast, _ = model.strategy.contrast_first(*alone)
        np.testing.assert_allclose(logits["vcd"], contrast, atol=1e-5)
        np.testing.assert_allclose(logits["greedy"], alone[0], atol=1e-5)
    finally:
        hook.remove()
        model.use_variant(Variant())
