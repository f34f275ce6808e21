"""Per-question results stay with their question, and an empty answer decides nothing.

- ``score_mixed`` (YN and MC of a call in one logits pass, as suite jobs run) gives, row by row, exactly the
  results of scoring each kind alone, for every variant: every field, VCD's statistics included.
- An answer whose first decoded token ends it (end of sequence) is ``unknown`` with an empty raw answer and
  the rule ``empty``, under every decoding; its first-token scores stay.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from PIL import Image

from verbmirage.models import create_model
from verbmirage.models.base import Question
from verbmirage.variants.settings import Variant

VARIANTS = {
    "greedy": {},
    "beam": {"decoding": "beam", "num_beams": 3, "max_new_tokens": 3},
    "sample": {"decoding": "sample", "max_new_tokens": 3, "seed": 2},
    "greedy_vcd": {"vcd": {}},
    "sample_vcd": {"decoding": "sample", "vcd": {"alpha": 0.5}, "max_new_tokens": 3},
    "beam_vcd": {"decoding": "beam", "num_beams": 2, "vcd": {}, "max_new_tokens": 3},
    "opera": {"decoding": "opera", "num_beams": 2, "max_new_tokens": 3, "opera": {"num_attn_candidates": 2}},
    "prompt": {"prompt_suffix": " Pay attention to the verb in question."},
}


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    base = tmp_path_factory.mktemp("rows")
    rng = np.random.default_rng(3)
    paths = []
    for k in range(3):
        path = base / f"img{k}.png"
        Image.fromarray(rng.integers(0, 255, (36 + 8 * k, 48, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def _questions(scene) -> tuple[list[Question], list[bool]]:
    """YN and MC questions on three images, shuffled so that neither kind comes first or in one block."""
    verbs = ["riding", "holding", "feeding", "washing"]
    options = ("riding a horse", "feeding a horse", "washing a horse", "holding a horse")
    asked = [(Question(f"y{i}", f"Is someone {verbs[i % 4]} a horse?", scene[i % 3]), False) for i in range(7)]
    asked += [(Question(f"m{i}", "Which of the following actions is present in the image?\n"
                        + "\n".join(f"{'ABCD'[j]}. {o}" for j, o in enumerate(options[i:] + options[:i])),
                        scene[(i + 1) % 3], options[i:] + options[:i]), True) for i in range(4)]
    random.Random(0).shuffle(asked)
    return [q for q, _ in asked], [flag for _, flag in asked]


def _same(a, b) -> bool:
    """Equal field by field (NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def llava(tiny_dirs):
    model = create_model("tiny", {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True})
    model.continue_tokens = 3
    return model


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_mixed_call_gives_each_question_its_own_results(llava, scene, name):
    llava.use_variant(Variant.from_config(VARIANTS[name]))
    questions, flags = _questions(scene)
    mixed = llava.score_mixed(questions, flags)
    llava.forget_prefixes()
    alone = dict(zip([q for q, f in zip(questions, flags) if not f],
                     llava.score_yes_no([q for q, f in zip(questions, flags) if not f])))
    llava.forget_prefixes()
    alone.update(zip([q for q, f in zip(questions, flags) if f],
                     llava.score_multiple_choice([q for q, f in zip(questions, flags) if f])))
    for question, result in zip(questions, mixed):
        expected = alone[question]
        for field in type(result).__dataclass_fields__:
            ours, theirs = getattr(result, field), getattr(expected, field)
            if field in ("p_yes", "yes_margin", "yes_mass", "confidence", "vcd_kl", "vcd_kl_reverse") \
                    and ours is not None and theirs is not None:
                # the mixed call batches other rows with it: float32 noise only, never another question's value
                assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6), (name, question.question_id, field)
            elif field == "option_probs":
                assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6), (name, question.question_id, field)
            else:
                assert _same(ours, theirs), (name, question.question_id, field, ours, theirs)
    if "vcd" in VARIANTS[name]:
        assert all(result.vcd_kl is not None and result.vcd_plausible >= 1 for result in mixed)
        kls = [result.vcd_kl for result in mixed]
        assert len({round(kl, 9) for kl in kls}) > 1  # per question, not one value for all


@pytest.fixture
def ends_at_once(llava):
    """The tiny LLaVA with its output layer's end-of-sequence logit lifted above all others at every step."""
    eos = llava.tokenizer.eos_token_id

    def lift(module, args, output):
        output = output.clone()
        output[..., eos] = output.max(dim=-1).values + 30.0  # sampling draws it too
        return output

    hook = llava.model.get_output_embeddings().register_forward_hook(lift)
    yield llava
    hook.remove()


@pytest.mark.parametrize("name", [*VARIANTS, "greedy_no_continuation"])
def test_an_answer_that_ends_at_once_is_unknown_under_every_decoding(ends_at_once, scene, name):
    model = ends_at_once
    model.use_variant(Variant.from_config(VARIANTS.get(name, {})))
    model.continue_tokens = 0 if name == "greedy_no_continuation" else 3
    model.forget_prefixes()
    questions, flags = _questions(scene)
    label = model.variant.label
    for result in model.score_mixed(questions, flags):
        assert (result.prediction, result.raw_answer, result.parse_rule) == ("unknown", "", f"{label}:empty"), name
        assert result.error is None and 0 < result.confidence <= 1
        if "vcd" in VARIANTS.get(name, {}):  # VCD's cut leaves only the end token plausible: no answer scores
            continue
        if hasattr(result, "p_yes"):
            assert 0 < result.p_yes < 1 and result.yes_margin is not None
        else:
            assert sum(result.option_probs) == pytest.approx(1.0)
    model.continue_tokens = 3


def test_the_end_lift_makes_the_engine_stop_at_once(ends_at_once, scene):
    """The fixture's premise, checked: greedy decoding of the lifted model emits nothing."""
    question = _questions(scene)[0][0]
    ends_at_once.use_variant(Variant.from_config({}))
    assert [answer[:2] for answer in ends_at_once.decoder.decode([question], False, ends_at_once.strategy)] == [(None, "")]
