"""Question-set invariants, on the demo and on the real anno.mat when present."""

import numpy as np
import pandas as pd
import pytest

from verbmirage.data.hico import hoi_vocabulary
from verbmirage.core.io import write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.benchmark.questions import (
    BUILDERS,
    ImageLabels,
    QuestionSettings,
    Vocabulary,
    build_question_set,
    build_question_sets,
    build_yn_obj,
    rare_hois,
)
from verbmirage.benchmark.question_sets import QUESTION_SETS
from verbmirage.benchmark.question_table import question_counts

SETTINGS = QuestionSettings()


def test_every_question_set_has_its_builder():
    """The sets' names and kinds (what planning reads) and their builders are two tables of the same sets."""
    assert list(BUILDERS) == list(QUESTION_SETS)


@pytest.fixture(scope="module", params=["demo", "real"])
def built(request):
    anno = request.getfixturevalue(f"{request.param}_anno")
    frames = build_question_sets(anno, list(QUESTION_SETS), SETTINGS)
    return request.param, anno, frames


def _image_labels(anno):
    index = {name.rsplit(".", 1)[0]: i for i, name in enumerate(anno.images["test"])}
    return lambda image_id: anno.labels["test"][index[image_id]]


def _label_rows(anno, questions) -> np.ndarray:
    """The test-label row (600 HOIs) of every question's image, one row per question (checks in array form:
    the real sets have 20K-60K rows)."""
    index = {name.rsplit(".", 1)[0]: i for i, name in enumerate(anno.images["test"])}
    return anno.labels["test"][questions.image_id.map(index).to_numpy()]


def _one_hot(keys: np.ndarray, names) -> np.ndarray:
    """(len(keys) x len(names)) booleans: row i marks names == keys[i]."""
    return np.asarray(keys)[:, None] == np.asarray(list(names))[None, :]


def test_yn_obj_invariants(built):
    _, anno, frames = built
    questions = frames["yn_obj"]
    hoi = questions.hoi_id.astype(int).to_numpy()
    assert (anno.hois.object.to_numpy()[hoi] == questions.object.to_numpy()).all()
    assert (anno.hois.verb.to_numpy()[hoi] == questions.verb.to_numpy()).all()
    assert (questions.verb != "no_interaction").all()
    # yes: positive; no: object present, HOI absent (neither positive nor ambiguous)
    label = _label_rows(anno, questions)[np.arange(len(questions)), hoi]
    expected = np.where(questions.answer == "yes", 1, -1)
    assert (label == expected).all(), questions[label != expected].head()
    per_object = questions.groupby(["image_id", "object"]).answer.value_counts().unstack(fill_value=0)
    assert (per_object["no"] == 2 * per_object["yes"]).all()  # protocol "paired": exactly 1:2 per object


def test_yn_sets_are_exactly_one_to_two(built):
    _, _, frames = built
    for qset in ("yn_obj", "yn_verb", "obj_exist"):
        answers = frames[qset].answer.value_counts()
        assert answers["no"] == 2 * answers["yes"], qset
    per_image = frames["yn_verb"].groupby("image_id").answer.value_counts().unstack(fill_value=0)
    assert (per_image["no"] == 2 * per_image["yes"]).all()
    assert frames["yn_obj"].groupby("image_id").prompt.apply(lambda p: p.is_unique).all()  # no negative twice


def test_obj_exist_is_on_the_verb_sets_images(built):
    _, anno, frames = built
    both = set(frames["yn_obj"].image_id) & set(frames["yn_verb"].image_id)
    asked = set(frames["obj_exist"].image_id)
    assert asked <= both
    # the only images of both left out show no object but a person ("Is there a person?" is never asked)
    objects, labels_of = anno.hois.object.to_numpy(), _image_labels(anno)
    for image_id in both - asked:
        assert set(objects[~np.isnan(labels_of(image_id))]) == {"person"}


def test_yn_verb_negatives_are_absent_from_the_image(built):
    _, anno, frames = built
    verbs, objects = anno.hois.verb.to_numpy(), anno.hois.object.to_numpy()
    questions = frames["yn_verb"]
    index = {name.rsplit(".", 1)[0]: i for i, name in enumerate(anno.images["test"])}
    image = questions.image_id.map(index).to_numpy()
    verb_names, object_names = sorted(set(verbs)), sorted(set(objects))
    verb = questions.verb.map({v: i for i, v in enumerate(verb_names)}).to_numpy()
    labels = anno.labels["test"]
    hoi_verb, hoi_object = _one_hot(verbs, verb_names).astype(int), _one_hot(objects, object_names).astype(int)
    done = ((labels == 1).astype(int) @ hoi_verb > 0)[image, verb]  # some HOI of the verb is positive
    done_or_ambiguous = (np.isin(labels, (0, 1)).astype(int) @ hoi_verb > 0)[image, verb]
    present = (~np.isnan(labels)).astype(int) @ hoi_object > 0  # image x object
    plausible = (present.astype(int) @ (hoi_object.T @ hoi_verb) > 0)[image, verb]  # a present object has the verb
    yes = (questions.answer == "yes").to_numpy()
    assert done[yes].all()
    assert not done_or_ambiguous[~yes].any()
    assert plausible[~yes].all(), "negative verb not plausible for any present object"
    assert questions.prompt.str.endswith("something?").all() and questions.object.isna().all()


@pytest.mark.parametrize("qset", ["mc_obj", "mc_verb"])
def test_mc_groups_rotate_one_correct_option(built, qset):
    _, anno, frames = built
    n = SETTINGS.mc_options
    questions = frames[qset].sort_values(["group_id", "rotation"], kind="stable")
    groups = len(questions) // n
    assert len(questions) == groups * n and questions.group_id.nunique() == groups  # n rows per group
    shaped = {column: questions[column].to_numpy().reshape(groups, n) for column in ("group_id", "rotation", "image_id")}
    assert (shaped["group_id"] == shaped["group_id"][:, :1]).all()
    assert (shaped["rotation"] == np.arange(n)).all()
    assert (shaped["image_id"] == shaped["image_id"][:, :1]).all()
    options = np.array([list(o) for o in questions.options]).reshape(groups, n, n)  # group x rotation x option
    base = options[:, 0, :]
    ordered = np.sort(base, axis=1)
    assert (ordered[:, 1:] != ordered[:, :-1]).all()  # n distinct options
    for rotation in range(n):
        assert (options[:, rotation, :] == np.roll(base, -rotation, axis=1)).all()
    letters = np.array([ord(a) - ord("A") for a in questions.answer]).reshape(groups, n)
    correct_text = base[np.arange(groups), letters[:, 0]]
    assert ((options == correct_text[:, None, None]).sum(axis=2) == 1).all()
    assert (np.take_along_axis(options, letters[:, :, None], axis=2)[:, :, 0] == correct_text[:, None]).all()
    assert ((letters[:, :-1] - letters[:, 1:]) % n == 1).all()  # the letter moves


def test_mc_obj_negative_options_are_absent_hois(built):
    _, anno, frames = built
    labels_of = _image_labels(anno)
    hoi_of = {(v, o): h for h, v, o in zip(anno.hois.hoi_id, anno.hois.verb, anno.hois.object)}
    from verbmirage.core.text import hoi_phrase

    phrase_to_hoi = {hoi_phrase(v, o): h for (v, o), h in hoi_of.items()}
    first = frames["mc_obj"][frames["mc_obj"].rotation == 0]
    for row in first.head(2000).itertuples():
        labels = labels_of(row.image_id)
        for k, option in enumerate(row.options):
            expected = 1 if chr(ord("A") + k) == row.answer else -1
            assert labels[phrase_to_hoi[option]] == expected


def test_obj_exist_invariants(built):
    _, anno, frames = built
    objects = anno.hois.object.to_numpy()
    questions = frames["obj_exist"]
    assert "person" not in set(questions.object)
    index = {name.rsplit(".", 1)[0]: i for i, name in enumerate(anno.images["test"])}
    image = questions.image_id.map(index).to_numpy()
    object_names = sorted(set(objects))
    hoi_object = _one_hot(objects, object_names).astype(int)
    annotated = (~np.isnan(anno.labels["test"])).astype(int) @ hoi_object  # image x object: its HOIs annotated
    counts = annotated[image, questions.object.map({o: i for i, o in enumerate(object_names)}).to_numpy()]
    yes = (questions.answer == "yes").to_numpy()
    assert (counts == hoi_object.sum(axis=0)[questions.object.map(object_names.index).to_numpy()])[yes].all()
    assert (counts[~yes] == 0).all()


def test_ids_unique_and_tags(built):
    _, anno, frames = built
    vocab = Vocabulary.from_hois(anno.hois)
    rare = rare_hois(anno.labels["train"], vocab, SETTINGS.rare_threshold)
    for qset, questions in frames.items():
        assert questions.question_id.is_unique
        assert list(questions.columns[: len(QUESTIONS.names)]) == QUESTIONS.names
        with_hoi = questions[questions.hoi_id.notna()]
        assert (with_hoi.rare == with_hoi.hoi_id.astype(int).isin(rare)).all()
        assert (questions.common == questions.verb.isin(SETTINGS.common_verbs)).all()
    assert frames["yn_obj"].rare.any() and not frames["yn_obj"].rare.all()


def test_byte_identical_and_seeded(demo_anno, tmp_path):
    first = build_question_set(demo_anno, "mc_obj", SETTINGS)
    second = build_question_set(demo_anno, "mc_obj", SETTINGS)
    write_table(first, tmp_path / "a.parquet", QUESTIONS, provenance={"seed": 0})
    write_table(second, tmp_path / "b.parquet", QUESTIONS, provenance={"seed": 0})
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    other = build_question_set(demo_anno, "mc_obj", QuestionSettings(seed=1))
    assert set(other.question_id) != set(first.question_id)

    def yes(seed, protocol):
        questions = build_question_set(demo_anno, "yn_obj", QuestionSettings(seed=seed, protocol=protocol))
        return set(questions.query("answer == 'yes'").question_id)

    # all_positives: positives do not depend on the seed, only the sampled negatives do; paired: how many do not
    assert yes(0, "all_positives") == yes(1, "all_positives")
    assert len(yes(0, "paired")) == len(yes(1, "paired"))


@pytest.mark.parametrize("built", ["real"], indirect=True)  # the module's real sets only (built once)
def test_real_counts_near_the_paper(built):
    """docs/questions.md, "Counts on the real anno.mat": the default protocol (paired), seed 0."""
    _, _, frames = built
    counts = question_counts(frames).set_index("qset")
    measured = {q: tuple(counts.loc[q, ["unique_questions", "yes", "no", "images"]]) for q in ("yn_obj", "yn_verb", "obj_exist")}
    assert measured == {
        "yn_obj": (40_749, 13_583, 27_166, 7_611),  # paper: 47K unique YN questions, Yes:No about 1:2
        "yn_verb": (40_731, 13_577, 27_154, 7_611),
        "obj_exist": (22_770, 7_590, 15_180, 7_445),
    }
    assert (counts.loc[["yn_obj", "yn_verb", "obj_exist"], "yes_share"] - 1 / 3).abs().max() < 1e-12
    assert counts.loc["yn_obj", "paper_yes_share"] == pytest.approx(1 / 3)
    mc = counts.loc["mc_obj"]
    assert abs(mc.unique_questions - 16_600) / 16_600 < 0.12  # 14,879: ambiguous HOIs are never negatives
    assert mc.rows == 4 * mc.unique_questions and pd.isna(mc.yes_share)


def test_real_counts_all_positives(real_anno):
    """The former default, kept as ``questions.protocol: all_positives``: every positive, Yes:No about 1:1.5."""
    settings = QuestionSettings(protocol="all_positives")
    frames = {qset: build_question_set(real_anno, qset, settings) for qset in ("yn_obj", "yn_verb")}
    counts = question_counts(frames).set_index("qset")
    assert tuple(counts.loc["yn_obj", ["unique_questions", "yes", "no", "images"]]) == (48_280, 19_145, 29_135, 8_593)
    assert tuple(counts.loc["yn_verb", ["unique_questions", "yes", "no", "images"]]) == (48_195, 19_092, 29_103, 8_593)
    assert counts.loc["yn_obj", "yes_share"] == pytest.approx(19_145 / 48_280)


def _one_image(positives: dict[str, int], negatives_available: dict[str, int]) -> tuple[ImageLabels, Vocabulary]:
    """An image with ``positives[o]`` positive HOIs of object o and ``negatives_available[o]`` absent ones."""
    vocab = Vocabulary.from_hois(hoi_vocabulary())
    chosen, present = set(), set()
    for obj, count in positives.items():
        hois_of = vocab.hois_of_object[obj]
        chosen |= set(hois_of[:count])
        present |= set(hois_of[: count + negatives_available[obj]])
    ambiguous = frozenset(h for obj in positives for h in vocab.hois_of_object[obj]) - present
    return ImageLabels("img", "img.jpg", frozenset(chosen), ambiguous, frozenset(positives)), vocab


def test_paired_protocol_oracle():
    """Per object: p positives, n negatives available, k = 2 -> min(p, n // 2) yes and twice as many no."""
    labels, vocab = _one_image({"horse": 3, "bed": 1, "dog": 1}, {"horse": 4, "bed": 1, "dog": 7})
    cases = {
        "paired": {"horse": (2, 4), "bed": (0, 0), "dog": (1, 2)},
        "all_positives": {"horse": (3, 4), "bed": (1, 1), "dog": (1, 2)},
    }
    for protocol, expected in cases.items():
        drafts = build_yn_obj(labels, vocab, QuestionSettings(protocol=protocol), np.random.default_rng(0))
        got = {o: (sum(d.answer == "yes" and d.object == o for d in drafts), sum(d.answer == "no" and d.object == o for d in drafts))
               for o in expected}
        assert got == expected, protocol
        assert all(d.hoi_id in labels.positives for d in drafts if d.answer == "yes")
        assert not {d.hoi_id for d in drafts if d.answer == "no"} & (labels.positives | labels.ambiguous)


def test_protocol_setting():
    assert QuestionSettings().protocol == "paired"
    assert QuestionSettings.from_config({"protocol": "all_positives", "seed": 3}).protocol == "all_positives"
    with pytest.raises(ValueError, match="questions.protocol: unknown protocol 'balanced'"):
        QuestionSettings(protocol="balanced")


def test_unknown_question_set(demo_anno):
    with pytest.raises(KeyError, match="unknown question set 'yn_objects'"):
        build_question_set(demo_anno, "yn_objects", SETTINGS)
