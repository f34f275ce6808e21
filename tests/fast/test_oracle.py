"""The noisy oracle: a stand-in whose answers carry the signal it states (the demo's model with signal)."""

import numpy as np
import pytest

from verbmirage.benchmark.conditions import apply_condition
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.benchmark.questions import QuestionSettings, build_question_set
from verbmirage.core.io import read_table, write_table
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.inference.runs import RunSpec, run_suite, suite_table
from verbmirage.models import ModelContext, Question, create_model


def _yes_no(n):
    questions = [Question(f"q{i}", "Is the person riding a horse?") for i in range(n)]
    return questions, {q.question_id: ("yes" if i % 3 == 0 else "no") for i, q in enumerate(questions)}


def test_the_oracle_answers_with_its_stated_accuracy_and_is_surer_when_right():
    questions, answers = _yes_no(4000)
    model = create_model("o", {"backend": "oracle", "accuracy": 0.7, "seed": 3}, ModelContext(answers=answers))
    results = model.score_yes_no(questions)
    right = np.array([r.prediction == answers[q.question_id] for q, r in zip(questions, results)])
    assert right.mean() == pytest.approx(0.7, abs=0.03)
    confidence = np.array([r.confidence for r in results])
    assert confidence[right].mean() > confidence[~right].mean() + 0.1  # Figs. 9 and 12 have something to show
    assert all(r.yes_margin is not None and (r.yes_margin >= 0) == (r.prediction == "yes") for r in results)
    # each answer depends on its question only: any batching, any order, the same answers
    again = model.score_yes_no(questions[::-1][:100])
    assert [r.p_yes for r in again] == [r.p_yes for r in results[::-1][:100]]


def test_the_oracle_hallucinates_verbs_alone_more_than_verbs_with_their_object():
    """``verb_accuracy`` on questions naming a verb but no object (yn_verb, mc_verb): the demo's Fig. 1 gap."""
    model = create_model("o", {"backend": "oracle", "accuracy": 0.9, "verb_accuracy": 0.65})
    with_object = [Question(f"o{i}", "Is someone riding a horse?", verb="ride", object="horse") for i in range(3000)]
    verb_alone = [Question(f"v{i}", "Is someone riding something?", verb="ride") for i in range(3000)]
    options = [Question(f"m{i}", "Which?", options=("a", "b", "c", "d"), verb="ride") for i in range(3000)]
    model.answers = {**{q.question_id: "yes" for q in with_object + verb_alone},
                     **{q.question_id: "A" for q in options}}
    right = [np.mean([r.prediction == model.answers[q.question_id] for q, r in zip(asked, scored)])
             for asked, scored in ((with_object, model.score_yes_no(with_object)),
                                   (verb_alone, model.score_yes_no(verb_alone)),
                                   (options, model.score_multiple_choice(options)))]
    assert right == pytest.approx([0.9, 0.65, 0.65], abs=0.03)
    with pytest.raises(ValueError, match=r"verb_accuracy: -0.1 is not in \[0, 1\]"):
        create_model("o", {"backend": "oracle", "verb_accuracy": -0.1})


def test_the_oracle_picks_the_right_option_as_often_and_needs_its_answer_key():
    questions = [Question(f"m{i}", "Which?", options=("a", "b", "c", "d")) for i in range(3000)]
    answers = {q.question_id: "ABCD"[i % 4] for i, q in enumerate(questions)}
    model = create_model("o", {"backend": "oracle", "accuracy": 0.9}, ModelContext(answers=answers))
    results = model.score_multiple_choice(questions)
    assert np.mean([r.prediction == answers[q.question_id] for q, r in zip(questions, results)]) == pytest.approx(
        0.9, abs=0.03)
    assert all(abs(sum(r.option_probs) - 1) < 1e-9 and r.confidence == max(r.option_probs) for r in results)
    blind = create_model("o", {"backend": "oracle"})
    with pytest.raises(ValueError, match="no answer key for question m0"):
        blind.score_multiple_choice(questions[:1])
    with pytest.raises(ValueError, match=r"accuracy: 1.5 is not in \[0, 1\]"):
        create_model("o", {"backend": "oracle", "accuracy": 1.5})


def test_only_the_oracle_is_handed_the_answer_key_by_an_inference_job(demo_anno, demo_roots, tmp_path):
    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(120)
    write_table(questions, tmp_path / "yn_obj.parquet", QUESTIONS)
    apply_condition(demo_roots[0], sorted(set(questions.image)), tmp_path / "clean", "clean", {"type": "clean"})
    paths = {"yn_obj": tmp_path / "yn_obj.parquet"}
    run_suite(paths, tmp_path / "oracle", RunSpec("oracle", {"backend": "oracle", "accuracy": 1.0}, tmp_path / "clean"))
    answered = read_table(suite_table(tmp_path / "oracle", "yn_obj"), PREDICTIONS).set_index("question_id")
    assert (answered.prediction.reindex(questions.question_id).to_numpy() == questions.answer.to_numpy()).all()
    run_suite(paths, tmp_path / "yes", RunSpec("always_yes", {"backend": "always_yes"}, tmp_path / "clean"))
    assert read_table(suite_table(tmp_path / "yes", "yn_obj"), PREDICTIONS).prediction.eq("yes").all()
