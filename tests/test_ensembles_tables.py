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


def _member(predictions, rules, p_yes=None, option_probs=None, errors=None):
    n = len(predictions)
    return pd.DataFrame({
        "question_id": [f"q{i}" for i in range(n)], "prediction": predictions, "parse_rule": rules,
        "p_yes": p_yes if p_yes is not None else [np.nan] * n,
        "option_probs": option_probs if option_probs is not None else [None] * n,
        "error": errors if errors is not None else [None] * n,
    })


def test_majority_vote_mc_tie_ignores_a_failed_member():
    """A failed member (error, NaN probabilities) neither votes nor turns the tie-break into 'first letter'."""
    failed = _member(["unknown", "unknown"], ["error", "error"], option_probs=[[np.nan] * 4] * 2,
                     errors=["image unreadable"] * 2)
    members = {
        "a": _member(["B", "B"], ["logits"] * 2, option_probs=[[0.1, 0.5, 0.3, 0.1], [0.1, 0.5, 0.3, 0.1]]),
        "b": _member(["C", "C"], ["logits"] * 2, option_probs=[[0.1, 0.2, 0.6, 0.1], [0.1, 0.3, 0.5, 0.1]]),
        "failed": failed,
    }
    votes = majority_vote(members, "mc")
    # q0: B 0.35 vs C 0.45 -> C; q1: 0.4 vs 0.4 exactly -> no rule breaks it -> unknown
    assert votes.prediction.tolist() == ["C", "unknown"]
    assert votes.parse_rule.tolist() == ["majority_vote:tie-probability", "majority_vote:tie-unknown"]
    assert votes.option_probs.iloc[0] == pytest.approx([0.1, 0.35, 0.45, 0.1])
    assert votes.confidence.iloc[0] == pytest.approx(0.5) and pd.isna(votes.confidence.iloc[1])


def test_majority_vote_text_members_do_not_break_yes_no_ties():
    """Parsed-text members' 0/1 P(yes) is their vote again: the tie goes by the graded members only."""
    members = {
        "text": _member(["yes", "yes", "no"], ["text:greedy:first-word"] * 3, p_yes=[1.0, 1.0, 0.0]),
        "scored": _member(["no", "no", "yes"], ["logits", "logits", "text:beam5:first-word"],
                          p_yes=[0.3, 0.45, 1.0]),
        "failed": _member(["unknown"] * 3, ["error"] * 3, errors=["timeout"] * 3),
    }
    votes = majority_vote(members, "yn")
    # q0, q1: 1 yes (text) vs 1 no (P(yes) 0.3 / 0.45): the scored member decides -> no (the old mean said yes)
    # q2: both text -> no graded probability -> the tie stays unknown
    assert votes.prediction.tolist() == ["no", "no", "unknown"]
    assert votes.p_yes.iloc[0] == pytest.approx(0.3) and np.isnan(votes.p_yes.iloc[2])
    assert votes.raw_answer.iloc[2] == "no:1 yes:1"


def test_majority_vote_unknown_without_valid_votes():
    members = {"a": _member(["unknown"], ["text:greedy:unparsed"]), "b": _member(["yes"], ["error"], errors=["x"])}
    votes = majority_vote(members, "yn")
    assert votes.prediction.tolist() == ["unknown"] and votes.parse_rule.tolist() == ["majority_vote:no-vote"]


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


def test_build_table_refuses_duplicate_keys():
    metrics = _long([("m1", "yn_obj", "clean", "accuracy", 0.5), ("m1", "yn_obj", "clean", "accuracy", 0.7)])
    with pytest.raises(ValueError, match=r"1 key\(s\) appear more than once.*'model': 'm1', 'qset': 'yn_obj', "
                                         r"'condition': 'clean', 'metric': 'accuracy'"):
        build_table(metrics, table1_columns(), ["m1"])
    # the same key in another subset is another cell
    other = _long([("m1", "yn_obj", "clean", "accuracy", 0.5)]).assign(subset="rare")
    table = build_table(pd.concat([metrics.iloc[:1], other]), table1_columns(), ["m1"])
    assert table.at[0, "yn_obj_acc"] == pytest.approx(50.0)


def test_undefined_values_print_as_a_dash(tmp_path):
    from verbmirage.io import MISSING_VALUE, write_html, write_markdown

    metrics = _long([("m1", "yn_obj", "clean", "accuracy", 0.5), ("m1", "yn_obj", "clean", "precision", np.nan)])
    table = build_table(metrics, table1_columns(), ["m1"])
    assert np.isnan(table.at[0, "yn_obj_prec"])  # undefined stays NaN in the Parquet table
    write_markdown(table, tmp_path / "t.md")
    write_html(table, tmp_path / "t.html")
    row = (tmp_path / "t.md").read_text().splitlines()[-1]
    assert "50.00" in row and MISSING_VALUE in row and "nan" not in row
    assert f"<td>{MISSING_VALUE}</td>" in (tmp_path / "t.html").read_text()
