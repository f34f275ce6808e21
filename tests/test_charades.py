"""CharadesEgo annotations, ego/exo pairs and frames (demo copy written with PyAV)."""

import pandas as pd
import pytest

from verbmirage.charades import (
    CSV_COLUMNS,
    ego_time,
    frame_at,
    load_split,
    load_vocabulary,
    parse_actions,
    video_pairs,
    write_demo_charadesego,
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_charadesego(tmp_path_factory.mktemp("charades"), pairs=4)


def test_demo_has_the_real_layout(demo):
    annotations = demo / "CharadesEgo"
    raw = pd.read_csv(annotations / "CharadesEgo_v1_test.csv")
    assert list(raw.columns) == CSV_COLUMNS
    assert set(raw.egocentric) == {"Yes", "No"}
    vocabulary = load_vocabulary(annotations)
    assert vocabulary.mapping["c003"] == ("o001", "v002")  # "Opening a door" = (door, open)
    assert vocabulary.classes["c003"] == "Opening a door" and vocabulary.objects["o001"] == "door"
    assert all((demo / "CharadesEgo_v1_480" / f"{video}.mp4").is_file() for video in raw.id)


def test_actions_field():
    assert parse_actions("c092 11.90 21.20;c147 0.00 12.60") == [("c092", 11.9, 21.2), ("c147", 0.0, 12.6)]
    assert parse_actions("") == [] and parse_actions(float("nan")) == []
    with pytest.raises(ValueError, match="row 7: cannot read action 'c092 11.90'"):
        parse_actions("c092 11.90", "CharadesEgo_v1_test.csv row 7")


def test_pairs_and_ego_time(demo):
    table = load_split(demo / "CharadesEgo", "test")
    pairs = video_pairs(table)
    assert len(pairs) == 4 and all(p.ego == p.exo + "EGO" for p in pairs.itertuples())
    ego = table.set_index("id")
    for pair in pairs.itertuples():
        for (c_exo, s_exo, _), (c_ego, s_ego, _) in zip(pair.actions, ego.at[pair.ego, "actions"]):
            assert c_exo == c_ego
            assert ego_time(s_exo, pair.exo_length, pair.ego_length) == pytest.approx(s_ego, abs=0.01)


def test_frames_come_from_the_requested_time(demo):
    video = demo / "CharadesEgo_v1_480" / "TE000.mp4"
    for seconds in (0.0, 1.23, 2.5, 3.97):
        shown, image = frame_at(video, seconds)
        assert shown <= seconds + 1e-6 < shown + 0.1 + 1e-6  # 10 frames per second
        assert image.size == (64, 48)
    shown, _ = frame_at(video, 999.0)
    assert shown > 3.5  # past the end: the last frame


def test_question_sets_ask_both_views_the_same(demo):
    from verbmirage.charades import build_charades_questions, extract_frames, frame_table

    annotations = demo / "CharadesEgo"
    vocabulary = load_vocabulary(annotations)
    frames = frame_table(video_pairs(load_split(annotations, "test")))
    frames = extract_frames(frames, demo / "CharadesEgo_v1_480", demo / "frames_out")
    assert frames.error.isna().all() and (demo / "frames_out" / frames.image.iloc[0]).is_file()
    by_frame = frames.set_index("frame_id")
    yn = {view: build_charades_questions(frames, vocabulary, f"yn_{view}") for view in ("exo", "ego")}
    assert yn["exo"].prompt.tolist() == yn["ego"].prompt.tolist()
    assert yn["exo"].answer.tolist() == yn["ego"].answer.tolist()
    assert set(yn["exo"].image.str.split("/").str[1]) == {"exo"} and set(yn["ego"].image.str.split("/").str[1]) == {"ego"}
    counts = yn["exo"].answer.value_counts()
    assert counts["yes"] == frames.query("view == 'exo'").shape[0] and counts["no"] <= counts["yes"]  # about 1:1
    text_to_class = {text: c for c, text in vocabulary.classes.items()}
    for row in yn["ego"].itertuples():
        positives = by_frame.at[row.image_id, "positives"]
        asked = text_to_class[row.prompt.removeprefix("Is someone ").rstrip("?").capitalize()]
        if row.answer == "yes":
            assert asked in positives
        else:  # a class that is not happening, about an object that is in the frame
            assert asked not in positives
            assert vocabulary.object_of(asked) in {vocabulary.object_of(c) for c in positives}
    mc = build_charades_questions(frames, vocabulary, "mc_ego")
    for _, group in mc.groupby("group_id"):
        assert sorted(group.rotation) == [0, 1, 2, 3]
        correct = {options[ord(a) - 65] for options, a in zip(group.options, group.answer)}
        assert len(correct) == 1
