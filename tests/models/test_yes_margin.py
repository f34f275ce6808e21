"""``yes_margin``: logsumexp(z[yes]) - logsumexp(z[no]) at the first answer position, the score Known-Object AP ranks by.

sigmoid(yes_margin) must equal P(yes) wherever both exist, and the margin must stay finite (and keep
the ranking) where P(yes) saturates at exactly 1.0.
"""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.models import Question, create_model
from verbmirage.models.base import yes_no_margin
from verbmirage.models.hf import LogitsVLM

from test_api_backend import model, server  # noqa: F401  (fixtures: a local fake API server)
from test_remote_adapters import FakeRemote

import remote_fake_driver as fake


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def _yes_no_questions(images, n=6):
    verbs = ["ride", "feed", "wash", "hold", "walk", "pet"]
    return [Question(f"q{i}", f"Is someone {verbs[i % 6]}ing a horse?", image=images[i % len(images)],
                     verb=verbs[i % 6], object="horse") for i in range(n)]


def test_margin_helper():
    assert yes_no_margin([1.0, 2.0], [0.0]) == pytest.approx(math.log(math.e + math.e**2))
    assert yes_no_margin([800.0], [0.0]) == 800.0  # no overflow
    assert yes_no_margin([1.0], []) is None and yes_no_margin([], [1.0]) is None


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "instructblip"])
def test_tiny_transformers_margin_is_the_logit_of_p_yes(tiny_dirs, images, family):
    tiny = create_model(family, {"backend": family, "path": str(tiny_dirs[family]), "local_files_only": True})
    results = tiny.score_yes_no(_yes_no_questions(images))
    for result in results:
        assert result.yes_margin is not None and math.isfinite(result.yes_margin)
        assert _sigmoid(result.yes_margin) == pytest.approx(result.p_yes, abs=1e-6)


def test_tiny_clip_margin_is_the_scaled_similarity_and_stays_finite_when_p_yes_saturates(tiny_dirs, images):
    settings = {"backend": "clip", "path": str(tiny_dirs["clip"]), "local_files_only": True}
    clip = create_model("clip", {**settings, "threshold": 0.0})
    for result in clip.score_yes_no(_yes_no_questions(images)):
        similarity = float(result.raw_answer.split("=")[1])
        assert result.yes_margin == pytest.approx(clip.logit_scale * similarity, abs=1e-3)
        assert _sigmoid(result.yes_margin) == pytest.approx(result.p_yes, abs=1e-6)
    # a threshold far below every cosine similarity (>= -1): margin >= 4 * logit_scale, so P(yes) rounds to
    # exactly 1.0 in float64, but the margins stay finite and still rank the answers
    saturating = create_model("clip", {**settings, "threshold": -5.0})
    assert 4 * saturating.logit_scale > 40
    saturated = saturating.score_yes_no(_yes_no_questions(images))
    assert all(r.p_yes == 1.0 for r in saturated)
    margins = [r.yes_margin for r in saturated]
    assert all(math.isfinite(m) and m > 40 for m in margins) and len(set(margins)) > 1


class _Tokenizer:
    tokens = ["Yes", "No", "A", "B", "x"]

    def __len__(self):
        return len(self.tokens)

    def decode(self, ids):
        return "".join(self.tokens[i] for i in ids)


class _FixedLogits(LogitsVLM):
    """The transformers scoring engine over given first-position logits (float32, as the engine gets them)."""

    backend = "fixed"
    uses_images = False

    def __init__(self, logits):
        super().__init__("fixed")
        self.tokenizer, self.logits = _Tokenizer(), torch.tensor(logits, dtype=torch.float32)
        self._find_answer_tokens()

    def answer_logits(self, questions, multiple_choice):
        return self.logits[: len(questions)], [None] * len(questions)


def test_engine_margin_is_finite_where_float32_p_yes_saturates():
    fixed = _FixedLogits([[40.0, 0.0, 0, 0, 0], [60.0, 0.0, 0, 0, 0], [1.0, 2.0, 0, 0, 0]])
    results = fixed.score_yes_no([Question(f"q{i}", "?") for i in range(3)])
    assert results[0].p_yes == results[1].p_yes == 1.0  # float32 softmax: the ranking is lost
    assert [r.yes_margin for r in results] == pytest.approx([40.0, 60.0, -1.0])
    assert _sigmoid(results[2].yes_margin) == pytest.approx(results[2].p_yes, abs=1e-6)


def test_engine_yes_mass_is_the_yes_share_of_the_whole_vocabulary_in_float64():
    """``yes_mass``: the paper's "probability of Yes tokens" read literally. Mass on other tokens can reverse
    its ranking against the renormalised P(yes); and it is float64 from the logits, since a confident model's
    float32 softmax gives 1.0 to every row (ties that change AP, the reason for ``yes_margin``)."""
    fixed = _FixedLogits([[2.0, 0.0, 5.0, 5.0, 5.0], [1.0, 1.0, -10.0, -10.0, -10.0],
                          [20.0, 0.0, 0, 0, 0], [21.0, 0.0, 0, 0, 0]])
    a, b, confident, more = fixed.score_yes_no([Question(f"q{i}", "?") for i in range(4)])
    e = math.exp
    assert a.yes_mass == pytest.approx(e(2) / (e(2) + 1 + 3 * e(5)), rel=1e-9)
    assert b.yes_mass == pytest.approx(e(1) / (2 * e(1) + 3 * e(-10)), rel=1e-9)
    assert a.p_yes > b.p_yes and a.yes_mass < b.yes_mass  # the two scores rank these two the other way round
    assert float(torch.softmax(torch.tensor([20.0, 0, 0, 0, 0]), -1)[0]) == 1.0  # float32 saturates ...
    assert confident.yes_mass == pytest.approx(1 - 4 * e(-20), rel=1e-12)  # ... float64 does not
    assert confident.yes_mass < more.yes_mass < 1.0


def test_remote_adapter_margin_from_the_driver_logits(tmp_path):
    images = {}
    for name in ("yes_horse", "bench"):
        images[name] = tmp_path / f"{name}.png"
        Image.new("RGB", (8, 8)).save(images[name])
    remote = FakeRemote("m", path=str(tmp_path), trust_remote_code=True, device="cpu")  # in-process driver
    results = remote.score_yes_no([Question("1", "Is it?", image=images["yes_horse"]),
                                   Question("2", "Is it?", image=images["bench"])])
    e = math.exp
    # the fake's yes ids (0, 1) and no ids (2, 3): logits (1, 2) vs (-5, -5), and (-5, -5) vs (2, -5)
    assert results[0].yes_margin == pytest.approx(math.log(e(1) + e(2)) - math.log(2 * e(-5)))
    assert results[1].yes_margin == pytest.approx(math.log(2 * e(-5)) - math.log(e(2) + e(-5)))
    for result, name in zip(results, images):
        assert _sigmoid(result.yes_margin) == pytest.approx(fake.expected_p_yes(name), abs=1e-6)
    remote.close()


def test_api_margin_from_logprobs_only_when_both_words_are_listed(model, tmp_path):  # noqa: F811  (a fixture, imported above)
    image = tmp_path / "img.jpg"
    Image.new("RGB", (8, 8)).save(image)
    plain, text_only = model.score_yes_no([Question("a", "plain question?", image=image),
                                               Question("b", "text only question?", image=image)])
    # the fake server lists " Yes" -0.1, " No" -2.5, "yes" -4.0
    assert plain.yes_margin == pytest.approx(math.log(math.exp(-0.1) + math.exp(-4.0)) + 2.5)
    assert _sigmoid(plain.yes_margin) == pytest.approx(plain.p_yes, abs=1e-9)
    assert text_only.yes_margin is None  # parsed text: no score


def test_baselines_and_multiple_choice_rows_have_no_margin(demo_anno, tmp_path):
    from verbmirage.inference.runs import predict
    from verbmirage.benchmark.questions import QuestionSettings, build_question_set

    always_yes = create_model("always_yes", {"backend": "always_yes"})
    for qset in ("yn_obj", "mc_obj"):
        questions = build_question_set(demo_anno, qset, QuestionSettings()).head(8)
        frame = predict(questions, always_yes, None)
        assert frame.yes_margin.isna().all()
        write_table(frame, tmp_path / f"{qset}.parquet", PREDICTIONS)
        assert read_table(tmp_path / f"{qset}.parquet", PREDICTIONS).yes_margin.isna().all()


def test_old_prediction_tables_without_the_column_still_read(tmp_path):
    old = pd.DataFrame({"question_id": ["a", "b"], "raw_answer": ["yes", "no"], "prediction": ["yes", "no"],
                        "parse_rule": ["logits"] * 2, "p_yes": [0.9, 0.2], "option_probs": [None, None],
                        "confidence": [0.9, 0.8], "error": [None, None]})
    schema = pa.schema([field for field in PREDICTIONS if field.name not in (
        "yes_margin", "yes_mass", "vcd_kl", "vcd_plausible", "vcd_kl_reverse", "image_sha256")])
    pq.write_table(pa.Table.from_pandas(old, schema=schema, preserve_index=False), tmp_path / "old.parquet")
    frame = read_table(tmp_path / "old.parquet", PREDICTIONS)
    assert frame.yes_margin.isna().all() and frame.yes_margin.dtype == "float64"
    assert frame.vcd_kl.isna().all() and frame.vcd_plausible.isna().all()  # added later too (VCD variants)
    assert frame.yes_mass.isna().all()  # and the raw P(Yes) (Known-Object ranking)
    assert frame.vcd_kl_reverse.isna().all()  # and VCD's KL in the other direction
    assert frame.image_sha256.isna().all()  # and the digest of the image asked on (a resume asks such rows again)
    assert frame.p_yes.tolist() == [0.9, 0.2]
    # a column that is there must still have the declared type
    bad = old.assign(yes_margin=["1.5", "2"])
    bad.to_parquet(tmp_path / "bad.parquet", index=False)
    with pytest.raises(ValueError, match="column 'yes_margin', row 0 .*declared double"):
        read_table(tmp_path / "bad.parquet", PREDICTIONS)
