"""CharadesEgo annotations, ego/exo pairs and frames (demo copy written with PyAV)."""

import pandas as pd
import pytest

from verbmirage.data.charades import (
    CSV_COLUMNS,
    DEMO_REPEATED_ACTION,
    ego_time,
    frame_at,
    load_split,
    frame_table,
    load_vocabulary,
    packaged_classes,
    parse_actions,
    video_pairs,
    write_demo_charadesego,
)
from verbmirage.benchmark.charades_questions import action_option, action_phrase, build_charades_questions


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_charadesego(tmp_path_factory.mktemp("charades"), pairs=4)


def test_demo_has_the_real_layout(demo):
    annotations = demo / "CharadesEgo"
    raw = pd.read_csv(annotations / "CharadesEgo_v1_test.csv")
    assert list(raw.columns) == CSV_COLUMNS
    assert set(raw.egocentric) == {"Yes", "No"}
    vocabulary = load_vocabulary(annotations)
    assert vocabulary.mapping["c008"] == ("o012", "v012")  # the real "c008 o012 v012": "Opening a door" = (door, open)
    assert vocabulary.classes["c008"] == "Opening a door" and vocabulary.objects["o012"] == "door"
    assert vocabulary.verbs["v012"] == "open"
    assert all((demo / "CharadesEgo_v1_480" / f"{video}.mp4").is_file() for video in raw.id)


def test_demo_class_files_are_the_real_157_classes(demo):
    vocabulary = load_vocabulary(demo / "CharadesEgo")
    assert list(vocabulary.classes) == [f"c{i:03d}" for i in range(157)]
    assert len(vocabulary.objects) == 38 and len(vocabulary.verbs) == 33
    assert vocabulary.classes["c149"] == "Someone is laughing" and vocabulary.mapping["c149"] == ("o000", "v009")
    assert vocabulary.objects["o000"] == "None" and vocabulary.verbs["v009"] == "laugh"
    assert vocabulary.classes["c087"] == "Taking a picture of something"
    assert vocabulary.objects[vocabulary.object_of("c087")] == "phone/camera"  # (phone/camera, photograph)
    no_object = [c for c in vocabulary.classes if vocabulary.object_of(c) == "o000"]
    assert no_object == ["c146", "c149", "c150", "c151", "c152", "c153", "c154"]
    assert set(packaged_classes().text) == set(vocabulary.classes.values())


def test_sentence_classes_become_questions():
    """Real classes written as sentences must not read "Is someone someone is laughing?"."""
    assert action_phrase("Someone is laughing") == "laughing"
    assert action_phrase("Someone is holding a paper/notebook") == "holding a paper/notebook"
    assert action_phrase("Opening a door") == "opening a door"
    assert action_phrase("Wash a dish/dishes") == "washing a dish/dishes"  # c121, the one non-gerund text
    assert action_option("Someone is eating something") == "Eating something"
    for text in packaged_classes().text:
        phrase = action_phrase(text)
        assert phrase.split()[0].split("/")[0].endswith("ing") and "someone is" not in phrase.lower(), text


def test_actions_field():
    assert parse_actions("c092 11.90 21.20;c147 0.00 12.60") == [("c092", 11.9, 21.2), ("c147", 0.0, 12.6)]
    assert parse_actions("") == [] and parse_actions(float("nan")) == []
    with pytest.raises(ValueError, match="row 7: cannot read action 'c092 11.90'"):
        parse_actions("c092 11.90", "CharadesEgo_v1_test.csv row 7")


def test_pairs_carry_each_views_own_intervals(demo):
    table = load_split(demo / "CharadesEgo", "test")
    pairs = video_pairs(table)
    assert len(pairs) == 4 and all(p.ego == p.exo + "EGO" for p in pairs.itertuples())
    ego = table.set_index("id")
    for pair in pairs.itertuples():
        assert pair.ego_actions == ego.at[pair.ego, "actions"] and pair.actions == ego.at[pair.exo, "actions"]
        assert {c for c, _, _ in pair.ego_actions} <= {c for c, _, _ in pair.actions}
    # the demo's ego rows are their own: one misses an action, another annotates it off the scaled time
    scaled = [[(c, round(ego_time(s, p.exo_length, p.ego_length), 2)) for c, s, _ in p.actions]
              for p in pairs.itertuples()]
    own = [[(c, round(s, 2)) for c, s, _ in p.ego_actions] for p in pairs.itertuples()]
    assert any(len(o) < len(s) for o, s in zip(own, scaled))
    assert any(set(o) - set(s) for o, s in zip(own, scaled))


def test_an_ego_frame_is_the_middle_of_the_ego_rows_own_interval_else_the_scaled_time():
    """The two views are separate recordings, each row with its own intervals: the ego frame of an action is the
    middle of the egocentric row's interval of it (of two, the one nearest the scaled time), not the scaled exo
    time, which can fall outside the action in the ego video; where that row does not annotate the action, the
    scaled time."""
    pairs = pd.DataFrame([{"exo": "AB12", "ego": "AB12EGO", "exo_length": 10.0, "ego_length": 20.0,
                           "actions": [("c001", 1.0, 3.0), ("c149", 6.0, 8.0), ("c002", 4.0, 5.0)],
                           "ego_actions": [("c149", 0.5, 1.5), ("c001", 9.0, 11.0), ("c149", 12.0, 13.0)]}])
    frames = frame_table(pairs).set_index("frame_id")
    assert frames.at["AB12_c001_1.00-3.00_ego", "seconds"] == 10.0  # its own 9-11 s, not the scaled 4 s
    assert frames.at["AB12_c149_6.00-8.00_ego", "seconds"] == 12.5  # the scaled 14 s is nearer 12-13 than 0.5-1.5
    assert frames.at["AB12_c002_4.00-5.00_ego", "seconds"] == 9.0  # not annotated in the ego row: 4.5 x 20 / 10
    assert frames.time_from.to_dict() == {
        "AB12_c001_1.00-3.00_exo": "own_interval", "AB12_c001_1.00-3.00_ego": "own_interval",
        "AB12_c149_6.00-8.00_exo": "own_interval", "AB12_c149_6.00-8.00_ego": "own_interval",
        "AB12_c002_4.00-5.00_exo": "own_interval", "AB12_c002_4.00-5.00_ego": "scaled_exo"}
    assert frames.at["AB12_c001_1.00-3.00_exo", "seconds"] == 2.0  # the exo frame: its own interval's middle


def test_frames_come_from_the_requested_time(demo):
    video = demo / "CharadesEgo_v1_480" / "TE000.mp4"
    for seconds in (0.0, 1.23, 2.5, 3.97):
        shown, image = frame_at(video, seconds)
        assert shown <= seconds + 1e-6 < shown + 0.1 + 1e-6  # 10 frames per second
        assert image.size == (64, 48)
    shown, _ = frame_at(video, 999.0)
    assert shown > 3.5  # past the end: the last frame


def test_question_sets_ask_both_views_the_same(demo):
    from verbmirage.data.charades import extract_frames, frame_table
    from verbmirage.benchmark.charades_questions import build_charades_questions

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
    prompt_to_class = {f"Is someone {action_phrase(text)}?": c for c, text in vocabulary.classes.items()}
    assert not yn["ego"].prompt.str.contains("someone is", case=False).any()
    assert yn["exo"].question_id.is_unique and not set(yn["exo"].question_id) & set(yn["ego"].question_id)
    for row in yn["ego"].itertuples():
        positives = by_frame.at[row.image_id, "positives"]
        asked = prompt_to_class[row.prompt]
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
    # counts.md: ours beside the paper's (Appendix A: 76K / 36K unique, 28K / 10K used, Yes:No about 1:1)
    from verbmirage.benchmark.question_table import question_counts

    counts = question_counts({**{f"yn_{v}": t for v, t in yn.items()}, "mc_ego": mc}, "charadesego").set_index("qset")
    assert counts.loc["yn_exo", ["paper_unique_questions", "paper_used_questions", "paper_yes_to_no"]].tolist() == [
        76_000, 28_000, "1:1"]
    assert counts.loc["mc_ego", ["paper_unique_questions", "paper_used_questions"]].tolist() == [36_000, 10_000]
    assert counts.loc["yn_ego", "unique_questions"] == len(yn["ego"]) and counts.loc["yn_ego", "paper_yes_share"] == 0.5
    # with the frame table: the share of ego frames from the ego row's own interval vs the scaled exo time
    counts = question_counts({**{f"yn_{v}": t for v, t in yn.items()}, "mc_ego": mc}, "charadesego",
                             frame_table=frames).set_index("qset")
    ego_frames = frames[frames.view == "ego"].set_index("frame_id").time_from.loc[yn["ego"].image_id.unique()]
    own = float((ego_frames == "own_interval").mean())
    assert 0 < own < 1  # the demo has both kinds
    assert counts.loc["yn_ego", ["ego_own_interval_share", "ego_scaled_exo_share"]].tolist() == pytest.approx(
        [own, 1 - own])
    assert counts.loc["yn_exo", ["ego_own_interval_share", "ego_scaled_exo_share"]].isna().all()
    from verbmirage.core.io import write_table
    from verbmirage.core.schemas import QUESTION_COUNTS

    write_table(counts.reset_index(), demo / "counts.parquet", QUESTION_COUNTS)  # the schema holds the columns


def test_a_class_done_twice_gets_a_frame_and_questions_per_interval(demo):
    """Two intervals of one class in one video: two frames, two files, distinct question ids."""
    vocabulary = load_vocabulary(demo / "CharadesEgo")
    pairs = pd.DataFrame([{"exo": "AB12", "ego": "AB12EGO", "exo_length": 10.0, "ego_length": 8.0,
                           "actions": [("c149", 0.5, 2.5), ("c152", 0.0, 9.0), ("c149", 6.0, 8.0), ("c149", 6.0, 8.0)]}])
    frames = frame_table(pairs)
    exo = frames[frames.view == "exo"]
    assert exo.frame_id.tolist() == ["AB12_c149_0.50-2.50_exo", "AB12_c152_0.00-9.00_exo", "AB12_c149_6.00-8.00_exo"]
    assert frames.frame_id.is_unique and frames.image.is_unique  # one file per interval and view
    assert exo.seconds.tolist() == [1.5, 4.5, 7.0]
    for qset in ("yn_exo", "yn_ego", "mc_exo"):
        questions = build_charades_questions(frames, vocabulary, qset)
        assert questions.question_id.is_unique, qset
        if qset.startswith("yn"):  # every interval is asked, on its own frame
            assert questions[questions.answer.eq("yes")].image_id.nunique() == 3


def test_demo_has_a_video_with_a_class_done_twice(demo):
    pairs = video_pairs(load_split(demo / "CharadesEgo", "test"))
    first = pairs.set_index("exo").at["TE000", "actions"]
    intervals = [(s, e) for c, s, e in first if c == DEMO_REPEATED_ACTION]
    assert len(intervals) >= 2 and len(set(intervals)) == len(intervals)
    frames = frame_table(pairs)
    repeated = frames[(frames.video == "TE000") & frames.action.eq(DEMO_REPEATED_ACTION)]
    assert repeated.image.nunique() == len(intervals)
