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
