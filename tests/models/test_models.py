"""The model interface, the registry and the blind baselines."""

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from verbmirage.benchmark.conditions import ImageResolver, apply_condition
from verbmirage.inference.runs import predict
from verbmirage.models import BACKENDS, ModelContext, Question, create_model
from verbmirage.models.baselines import training_frequencies
from verbmirage.benchmark.questions import QuestionSettings, build_question_set


@pytest.fixture(scope="module")
def train_stats(demo_anno, tmp_path_factory):
    path = tmp_path_factory.mktemp("stats") / "train_stats.parquet"
    training_frequencies(demo_anno).to_parquet(path)
    return path


def test_registry_is_lazy_and_checks_names():
    assert {"always_yes", "random", "prior"} <= set(BACKENDS)
    sys.modules.pop("verbmirage.models.baselines", None)
    import verbmirage.models  # noqa: F401

    assert "verbmirage.models.baselines" not in sys.modules
    with pytest.raises(KeyError, match="unknown backend 'llava_2'"):
        create_model("x", {"backend": "llava_2"})
    with pytest.raises(TypeError, match=r"models.r: backend 'random' takes no setting\(s\) \['temperature'\]"):
        create_model("r", {"backend": "random", "temperature": 1.0})


@pytest.mark.parametrize("damaged", ["model.safetensors", "config.json"])
def test_a_damaged_file_of_a_built_model_folder_is_named(tmp_path, damaged):
    """What a derived model's or a tiny model's folder damaged after its build gives (the libraries name no file)."""
    from verbmirage.models.registry import DamagedModelError
    from verbmirage.models.tiny import build_tiny_llava

    folder = build_tiny_llava(tmp_path / "tiny_llava")
    file = folder / damaged
    file.write_bytes(file.read_bytes()[:7])
    with pytest.raises(DamagedModelError, match=rf"models.m: a file in path {folder} cannot be read .*delete it and "
                                                 "rerun"):
        create_model("m", {"backend": "llava", "path": str(folder), "local_files_only": True})


def test_damaged_training_statistics_are_named(tmp_path):
    from verbmirage.core.io import DamagedTableError

    (tmp_path / "train_stats.parquet").write_bytes(b"PAR1")
    with pytest.raises(DamagedTableError, match="train_stats.parquet: not a readable Parquet table"):
        create_model("prior", {"backend": "prior"}, ModelContext(train_stats=tmp_path / "train_stats.parquet"))


#: What a backend can do, declared on the base class with the default most backends have.
CAPABILITIES = {"uses_images": True, "reads_answers": False, "mixed_kinds": False, "continue_tokens": None,
                "prompts": None, "checks_scores": True}


def test_every_capability_is_declared_on_the_base_class_and_read_directly():
    """A backend declares only the capabilities it changes; no caller guesses one with getattr or hasattr."""
    from verbmirage.models.base import VisionLanguageModel
    from verbmirage.models.registry import backend_class

    assert {name: getattr(VisionLanguageModel, name) for name in CAPABILITIES} == CAPABILITIES
    assert [backend_class(name).reads_answers for name in ("oracle", "always_yes", "llava")] == [True, False, False]
    assert backend_class("llava").mixed_kinds and backend_class("llava").continue_tokens == 8
    src = Path(__file__).resolve().parents[1] / "src"
    guessed = re.compile(r'(?:getattr|hasattr)\((?:self|model|self\.model|backend_class\([^)]*\)), "(\w+)"')
    found = {f"{path.relative_to(src)}: {name}" for path in src.rglob("*.py")
             for name in guessed.findall(path.read_text())
             if name in CAPABILITIES or name in ("backend", "image_mode", "fingerprint_extra", "close")}
    assert not found


def test_a_decision_wrapper_passes_the_continuation_to_its_model():
    """The job sets ``continue_tokens`` on whatever it loaded; a calibrated model's own model decodes."""
    from verbmirage.models.base import VisionLanguageModel
    from verbmirage.models.calibrated import CalibratedModel

    class Decoding(VisionLanguageModel):
        continue_tokens = 8

        def _score_yes_no(self, questions):
            raise NotImplementedError

        _score_multiple_choice = _score_yes_no

    inner = Decoding("m")
    wrapper = CalibratedModel(inner, rule=None)
    wrapper.continue_tokens = 3
    assert (inner.continue_tokens, wrapper.continue_tokens) == (3, 3)
    assert CalibratedModel(create_model("r", {"backend": "random"}), rule=None).continue_tokens is None


def test_planned_setting_choices_are_what_the_backends_accept():
    """The dtype names planning allows are the engine's; a backend refuses what planning refuses."""
    from verbmirage.models.hf.tokens import DTYPES
    from verbmirage.models.registry import SETTING_CHOICES, setting_problems

    assert set(SETTING_CHOICES["dtype"]) == set(DTYPES)
    assert setting_problems("llava", {"dtype": "bfloat16", "device": "cuda:1", "revision": None}) == []
    with pytest.raises(ValueError, match="dtype: 'fp32' is not one of"):
        create_model("m", {"backend": "llava", "path": "nowhere", "dtype": "fp32"})


def test_settings_read_from_the_source_equal_the_imported_signatures():
    """backend_settings (read while planning, nothing imported) names what create_model would accept."""
    import inspect
    import subprocess

    from verbmirage.models.registry import backend_class, backend_settings, backend_uses_images

    planned = subprocess.run(  # a fresh interpreter: planning imports no backend module (torch stays out)
        [sys.executable, "-c", "import sys; from verbmirage.models.registry import BACKENDS, backend_settings\n"
         "[backend_settings(b) for b in BACKENDS]; print(sorted(m for m in sys.modules if m.startswith("
         "('torch', 'transformers', 'verbmirage.models.hf', 'verbmirage.models.remote'))))"],
        capture_output=True, text=True, check=True)
    assert planned.stdout.strip() == "[]"
    for backend in BACKENDS:
        parameters = inspect.signature(backend_class(backend).__init__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        expected = None if takes_any else frozenset(parameters) - {"self", "name", "context"}
        assert backend_settings(backend) == expected, backend
    assert "dtype" in backend_settings("llava") and "threshold" in backend_settings("clip")
    assert backend_settings("tests_module:Mine") is None  # a custom backend is checked when its job loads it
    # the same for whether a backend looks at the image (Fig. 4(b) marks those that never do)
    assert {b: backend_uses_images(b) for b in BACKENDS} == {b: backend_class(b).uses_images for b in BACKENDS}
    assert not backend_uses_images("oracle") and backend_uses_images("llava")


def test_baselines_answer_both_kinds():
    yes = create_model("y", {"backend": "always_yes"})
    yn = [Question("q1", "Is someone riding a horse?"), Question("q2", "Is someone feeding a horse?")]
    mc = [Question("q3", "Which?", options=("a", "b", "c", "d"))]
    assert [r.prediction for r in yes.score_yes_no(yn)] == ["yes", "yes"]
    assert yes.score_multiple_choice(mc)[0].prediction == "A"
    random_model = create_model("r", {"backend": "random", "seed": 3})
    first = random_model.score_yes_no(yn)
    assert first == random_model.score_yes_no(list(reversed(yn)))[::-1]  # order-independent
    probs = random_model.score_multiple_choice(mc)[0].option_probs
    assert sum(probs) == pytest.approx(1.0) and len(probs) == 4
    with pytest.raises(ValueError, match="multiple choice needs"):
        yes.score_multiple_choice(yn)
    with pytest.raises(ValueError, match="has no options"):
        yes.score_yes_no(mc)


def test_language_prior_uses_training_frequencies(demo_anno, train_stats):
    stats = pd.read_parquet(train_stats)
    hoi = stats[(stats.kind == "hoi") & (stats.total > 20)].sort_values("p_yes")
    rare, frequent = hoi.iloc[0], hoi.iloc[-1]
    assert frequent.positives <= frequent.total
    prior = create_model("p", {"backend": "prior"}, ModelContext(train_stats=train_stats))
    results = prior.score_yes_no(
        [Question("a", "", verb=rare.verb, object=rare.object), Question("b", "", verb=frequent.verb, object=frequent.object)]
    )
    assert results[0].p_yes < results[1].p_yes
    assert results[1].p_yes == pytest.approx((frequent.positives + 1) / (frequent.total + 2))
    from verbmirage.core.text import hoi_phrase

    options = (hoi_phrase(rare.verb, rare.object), hoi_phrase(frequent.verb, frequent.object))
    choice = prior.score_multiple_choice([Question("c", "", options=options)])[0]
    assert choice.prediction == "B"
    with pytest.raises(ValueError, match="statistics"):
        create_model("p", {"backend": "prior"})


def test_training_frequencies_match_counts(demo_anno):
    stats = training_frequencies(demo_anno)
    labels = demo_anno.labels["train"]
    row = stats[(stats.kind == "hoi")].sort_values("positives").iloc[-1]
    hoi_id = demo_anno.hois[(demo_anno.hois.verb == row.verb) & (demo_anno.hois.object == row.object)].hoi_id.iloc[0]
    assert row.positives == (labels[:, hoi_id] == 1).sum()
    assert row.total == np.isin(labels[:, hoi_id], (1, -1)).sum()


def test_predict_keeps_order_and_records_missing_images(demo_anno, demo_roots, tmp_path):
    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(40)
    images = sorted(set(questions.image))
    manifest = apply_condition(demo_roots[0], images[1:], tmp_path / "clean", "clean", {"type": "clean"})
    assert len(manifest) == len(images) - 1

    class NeedsImages(type(create_model("y", {"backend": "always_yes"}))):
        uses_images = True

    predictions = predict(questions, NeedsImages("seeing"), ImageResolver(tmp_path / "clean"), batch_size=7)
    assert predictions.question_id.tolist() == questions.question_id.tolist()
    missing = questions.image == images[0]
    assert predictions.error[missing.to_numpy()].notna().all() and predictions.error[~missing.to_numpy()].isna().all()
    assert (predictions.prediction[missing.to_numpy()] == "unknown").all()
    blind = predict(questions, create_model("y", {"backend": "always_yes"}), ImageResolver(tmp_path / "clean"))
    assert blind.error.isna().all()  # a blind model never asks for the image


# ---- which scores must be finite (the result types' docstrings) ---------------------------------------------------
def _yes_no(p_yes=0.7, confidence=0.6, parse_rule="greedy:first-token", **extra):
    from verbmirage.models.base import YesNoResult

    return YesNoResult(p_yes, "yes", "Yes", confidence, parse_rule, **extra)


def _choice(probs=(0.2, 0.8), confidence=0.6, parse_rule="greedy:first-token"):
    from verbmirage.models.base import MultipleChoiceResult

    return MultipleChoiceResult(tuple(probs), "B", "B", confidence, parse_rule)


@pytest.mark.parametrize("result, problem", [
    # undefined where the rules allow it: an answer
    (_yes_no(), None),
    (_yes_no(p_yes=np.float32(0.25), confidence=np.float64(0.5), yes_margin=-1.1, vcd_kl=0.0, vcd_plausible=1), None),
    (_yes_no(p_yes=float("nan")), None),  # VCD's cut removed every yes and no spelling
    (_yes_no(p_yes=float("nan"), confidence=float("nan"), parse_rule="text:greedy:unparsed"), None),  # API, no logprobs
    (_choice(probs=(float("nan"),) * 2), None),  # no mass on any option letter
    (_choice(probs=(0.0, 1.0), confidence=float("nan"), parse_rule="text:sample:letter"), None),
    # broken numbers: an error
    (_yes_no(p_yes=float("nan"), confidence=float("nan")), "confidence = nan"),  # NaN logits (VCD alpha = inf)
    (_yes_no(p_yes=float("inf")), "p_yes = inf"),
    (_yes_no(confidence=float("-inf"), parse_rule="text:greedy:yes"), "confidence = -inf"),
    (_yes_no(yes_margin=float("nan")), "yes_margin = nan"),  # undefined is None
    (_yes_no(yes_margin=float("inf")), "yes_margin = inf"),
    (_yes_no(vcd_kl=float("nan")), "vcd_kl = nan"),
    (_yes_no(vcd_kl=0.1, vcd_kl_reverse=float("inf")), "vcd_kl_reverse = inf"),
    (_yes_no(yes_mass=float("nan")), "yes_mass = nan"),
    (_yes_no(p_yes=None), "p_yes = None, not a number"),
    (_choice(probs=(float("nan"), 0.5)), r"option_probs = \(nan, 0.5\) \(some NaN, some not\)"),
    (_choice(probs=(float("inf"), 0.0)), r"option_probs\[0\] = inf"),
    (_choice(confidence=float("nan")), "confidence = nan"),
])
def test_which_scores_may_be_undefined(result, problem):
    from verbmirage.models.base import score_problem

    found = score_problem(result)
    assert found is None if problem is None else re.fullmatch(problem, found), found


def test_a_non_finite_score_becomes_an_error_row_the_budget_counts(tmp_path):
    """Every backend's answers pass the base class's result check: a NaN score from any backend (here a custom
    one) is an error row naming model, question and image, and more of them than max_error_share fail the job."""
    from verbmirage.models.calibrated import CalibratedModel, ThresholdRule
    from verbmirage.inference.runs import IncompleteShardError
    from verbmirage.models.base import VisionLanguageModel

    class Overflowing(VisionLanguageModel):
        backend, uses_images = "overflowing", False

        def _score_yes_no(self, questions):
            return [_yes_no(float("nan"), float("nan")) if q.question_id.endswith("1") else
                    _yes_no(float("nan"), float("nan"), "text:greedy:unparsed") for q in questions]

        def _score_multiple_choice(self, questions):
            return [_choice((float("inf"), 0.0)) for _ in questions]

    model = Overflowing("fp16_model")
    yes_no = model.score_yes_no([Question("q1", "?", image=tmp_path / "a.jpg"), Question("q2", "?")])
    assert yes_no[0].error == ("models.fp16_model: question q1 on image " + str(tmp_path / "a.jpg") + ": non-finite "
                               "score, confidence = nan; check the model's dtype and the variant's settings")
    assert (yes_no[0].prediction, yes_no[0].parse_rule, yes_no[0].retry) == ("unknown", "error", False)
    assert yes_no[1].error is None  # text-scored and unparsed: undefined, an answer
    (choice,) = model.score_multiple_choice([Question("q3", "?", options=("a", "b"))])
    assert "question q3 on image None: non-finite score, option_probs[0] = inf" in choice.error
    assert len(choice.option_probs) == 2
    # a decision rule over the checked answers renames a text-scored rule; its NaN confidence is no error
    calibrated = CalibratedModel(model, ThresholdRule({"yn_obj": 0.0}, {"q2": "yn_obj"}))
    assert calibrated.score_yes_no([Question("q2", "?")])[0].error is None
    # in a job: error rows, counted by the budget
    questions = pd.DataFrame({"question_id": ["q1", "q2"], "qset": "yn_obj", "prompt": "?", "image": "a.jpg",
                              "options": None, "verb": "ride", "object": "horse"})
    rows = predict(questions, model, None, max_error_share=0.5)
    assert rows.error.notna().tolist() == [True, False]
    with pytest.raises(IncompleteShardError, match=r"1 of 2 questions failed, more than max_error_share=0.4; first "
                                                   r"error: models.fp16_model: question q1 on image None"):
        predict(questions, model, None, max_error_share=0.4)
    with pytest.raises(ValueError, match=r"inference.max_error_share: \.nan is not a finite number"):
        predict(questions, model, None, max_error_share=float("nan"))
