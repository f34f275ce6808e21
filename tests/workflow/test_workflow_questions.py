"""The demo's question tables: the paper's 1:2 YN mix, obj_exist on the verb sets' images, CharadesEgo fixes."""

from __future__ import annotations

import pandas as pd
import pytest

from verbmirage.data.charades import DEMO_REPEATED_ACTION
from verbmirage.core.io import read_table
from verbmirage.core.schemas import QUESTION_COUNTS

pytestmark = pytest.mark.slow


def test_counts_table_shows_the_exact_one_to_two_mix(demo_run):
    counts = read_table(demo_run / "results/benchmark/hico/counts.parquet", QUESTION_COUNTS).set_index("qset")
    for qset in ("yn_obj", "yn_verb", "obj_exist"):  # questions.protocol: paired (the default)
        assert counts.at[qset, "no"] == 2 * counts.at[qset, "yes"] > 0, qset
        assert counts.at[qset, "yes_share"] == pytest.approx(1 / 3), qset
    assert counts.at["yn_obj", "paper_yes_share"] == pytest.approx(1 / 3)
    assert counts.at["yn_obj", "paper_yes_to_no"] == "1:2"
    assert pd.isna(counts.at["mc_obj", "yes_share"])


def test_obj_exist_asks_the_verb_sets_images(demo_run):
    sets = {q: pd.read_parquet(demo_run / f"results/benchmark/hico/{q}.parquet") for q in ("yn_obj", "yn_verb", "obj_exist")}
    assert set(sets["obj_exist"].image_id) <= set(sets["yn_obj"].image_id) & set(sets["yn_verb"].image_id)


def test_charadesego_counts_say_where_the_ego_frames_come_from(demo_run):
    """The demo's egocentric rows annotate most actions themselves and miss some: both kinds of ego frame occur,
    and the counts table gives each ego set's share of both."""
    counts = read_table(demo_run / "results/benchmark/charadesego/counts.parquet", QUESTION_COUNTS).set_index("qset")
    for qset in ("yn_ego", "mc_ego"):
        own, scaled = counts.loc[qset, ["ego_own_interval_share", "ego_scaled_exo_share"]]
        assert 0 < own < 1 and own + scaled == pytest.approx(1.0), qset
    assert counts.loc[["yn_exo", "mc_exo"], ["ego_own_interval_share", "ego_scaled_exo_share"]].isna().all().all()
    assert "ego_own_interval_share" in (demo_run / "results/benchmark/charadesego/counts.md").read_text()


def test_charadesego_sentence_classes_and_repeated_actions(demo_run):
    frames = pd.read_parquet(demo_run / "results/benchmark/charadesego/frames.parquet")
    assert frames.frame_id.is_unique and frames.image.is_unique
    repeated = frames[frames.frame_id.str.startswith("TE000_") & frames.action.eq(DEMO_REPEATED_ACTION)]
    assert len(repeated) >= 4 and repeated.image.is_unique  # two intervals, two views
    for qset in ("yn_exo", "yn_ego", "mc_exo", "mc_ego"):
        questions = pd.read_parquet(demo_run / f"results/benchmark/charadesego/{qset}.parquet")
        assert questions.question_id.is_unique, qset
        assert not questions.prompt.str.contains("someone is", case=False).any(), qset
    yes_no = pd.read_parquet(demo_run / "results/benchmark/charadesego/yn_exo.parquet")
    assert "Is someone laughing?" in set(yes_no.prompt[yes_no.image_id.str.startswith(f"TE000_{DEMO_REPEATED_ACTION}_")])
