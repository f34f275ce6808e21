"""Majority vote and the paper tables derived from the long metrics table."""

import numpy as np
import pandas as pd
import pytest

from verbmirage.ensembles import majority_vote
from verbmirage.tables import build_table, table1_columns, table2_columns, table3


def _predictions(answers, p_yes):
    return pd.DataFrame({"question_id": [f"q{i}" for i in range(len(answers))], "prediction": answers, "p_yes": p_yes})


def test_majority_vote_yes_no():
    members = {
        "a": _predictions(["yes", "yes", "no", "unknown"], [0.9, 0.8, 0.2, None]),
        "b": _predictions(["yes", "no", "no", "unknown"], [0.7, 0.4, 0.1, None]),
        "c": _predictions(["no", "no", "yes", "unknown"], [0.3, 0.2, 0.6, None]),
    }
    votes = majority_vote(members, "yn")
    assert votes.prediction.tolist() == ["yes", "no", "no", "unknown"]
    assert votes.confidence.iloc[0] == pytest.approx(2 / 3)
    assert votes.p_yes.iloc[0] == pytest.approx((0.9 + 0.7 + 0.3) / 3)


def test_majority_vote_tie_uses_mean_probability():
    members = {"a": _predictions(["yes", "yes"], [0.9, 0.55]), "b": _predictions(["no", "no"], [0.3, 0.05])}
    assert majority_vote(members, "yn").prediction.tolist() == ["yes", "no"]


def test_majority_vote_rejects_mismatched_members():
    with pytest.raises(ValueError, match="different set of questions"):
        majority_vote({"a": _predictions(["yes"], [1.0]), "b": _predictions(["yes", "no"], [1.0, 0.0])}, "yn")


def _long(rows):
    base = dict(dataset="hico", variant="default", subset="all", ci_low=np.nan, ci_high=np.nan, n=10)
    return pd.DataFrame([{**base, **dict(zip(("model", "qset", "condition", "metric", "value"), r))} for r in rows])


def test_table1_from_long_table():
    metrics = _long([
        ("m1", "yn_obj", "clean", "accuracy", 0.5216),
        ("m1", "yn_obj", "clean", "precision", 0.4099),
        ("m1", "mc_verb", "clean", "circular_accuracy", 0.51),
        ("m1", "mc_verb", "saltpepper", "circular_accuracy", 0.99),  # other condition: ignored
    ])
    table = build_table(metrics, table1_columns(), ["m1", "m2"])
    assert table.columns.tolist()[:3] == ["model", "yn_obj_acc", "yn_obj_prec"]
    row = table.set_index("model").loc["m1"]
    assert row.yn_obj_acc == pytest.approx(52.16) and row.mc_verb_acc == pytest.approx(51.0)
    assert np.isnan(row.yn_verb_acc) and table.set_index("model").loc["m2"].isna().all()


def test_table2_and_3():
    metrics = _long([
        ("m1", "yn_verb", "clean_vs_saltpepper", "error_consistency", 0.7385),
        ("m1", "yn_verb", "saltpepper", "f1", 0.5735),
        ("vote", "yn_obj", "clean", "recall", 0.9117),
    ])
    two = build_table(metrics, table2_columns(), ["m1"]).iloc[0]
    assert two.yn_err_cons == pytest.approx(73.85) and two.yn_f1_saltpepper == pytest.approx(57.35)
    three = table3(metrics, {"vote": ["m1", "m2"]})
    assert three.model.tolist() == ["m1", "m2", "vote"]
    assert three.set_index("model").at["vote", "yn_obj_recall"] == pytest.approx(91.17)
