"""Majority vote and the paper tables derived from the long metrics table."""

import numpy as np
import pandas as pd
import pytest

from verbmirage.evaluation.ensembles import majority_vote
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers
from verbmirage.evaluation.tables import measured_rows, paper_tables, table1_columns


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
    table = measured_rows(metrics, table1_columns(), ["m1", "m2"])
    assert table.columns.tolist()[:6] == ["source", "model", "variant", "paper_name", "yn_obj_acc", "yn_obj_prec"]
    assert table.model.tolist() == ["m1"]  # m2 has no value anywhere: not run, no row
    row = table.set_index("model").loc["m1"]
    assert row.yn_obj_acc == pytest.approx(52.16) and row.mc_verb_acc == pytest.approx(51.0)
    assert np.isnan(row.yn_verb_acc) and row.source == "measured"


def test_table1_shows_the_share_of_unknown_answers_beside_each_accuracy():
    """An accuracy near 0 under sampling is explained by its unknown share: Table 1 carries it (ours: the
    paper prints none, so its rows show none)."""
    metrics = _long([
        ("m1", "yn_obj", "clean", "accuracy", 0.0065),
        ("m1", "yn_obj", "clean", "unknown_ratio", 0.98),
        ("m1", "mc_verb", "clean", "unknown_ratio", 0.5),
    ])
    table = paper_tables(metrics, PAPER, ["m1"], {}, [], paper_names={"m1": "LLaVA-1.5-7B"})[1]
    ours = table.frame[table.frame.source.eq("measured")].set_index("model")
    assert ours.at["m1", "yn_obj_unknown"] == pytest.approx(98.0) and ours.at["m1", "mc_verb_unknown"] == 50.0
    assert table.frame[table.frame.source.eq("paper")].yn_obj_unknown.isna().all()
    shown = table.display()
    assert shown.columns.tolist()[-4:] == ["yn_obj_unknown", "yn_verb_unknown", "mc_obj_unknown", "mc_verb_unknown"]
    assert shown[shown.source.eq("measured")].yn_obj_unknown.iloc[0] == "98.00"


def test_table2_every_pair_and_table3_members_then_ensemble():
    metrics = _long([
        ("m1", "yn_verb", "clean_vs_saltpepper", "error_consistency", 0.7385),
        ("m1", "yn_verb", "saltpepper", "f1", 0.5735),
        ("m1", "mc_verb", "clean_vs_crop", "error_consistency", 0.25),
        ("m1", "yn_obj", "clean", "recall", 0.5),
        ("vote", "yn_obj", "clean", "recall", 0.9117),
    ])
    tables = paper_tables(metrics, load_paper_numbers(packaged_paper_numbers()), ["m1", "m2"], {"vote": ["m1", "m2"]},
                          [("clean", "saltpepper"), ("clean", "crop")])
    two = tables[2].frame
    ours = two[two.source.eq("measured")].set_index("other")
    assert ours.at["saltpepper", "yn_err_cons"] == pytest.approx(73.85)
    assert ours.at["saltpepper", "yn_f1_other"] == pytest.approx(57.35)
    assert ours.at["crop", "mc_err_cons"] == pytest.approx(25.0)
    three = tables[3].frame
    assert three[three.source.eq("measured")].model.tolist() == ["m1", "vote"]
    assert three.set_index(["source", "model"]).at[("measured", "vote"), "yn_obj_recall"] == pytest.approx(91.17)


def test_table2_reads_the_reference_on_single_instance_images_beside_a_crop():
    """crop asks only single-instance images: the clean column beside it must count the same questions."""
    metrics = pd.concat([_long([
        ("m1", "mc_verb", "clean", "circular_accuracy", 0.59),  # all images
        ("m1", "yn_verb", "clean", "accuracy", 0.70),
        ("m1", "mc_verb", "crop", "circular_accuracy", 0.50),
        ("m1", "yn_verb", "crop", "accuracy", 0.60),
        ("m1", "mc_verb", "saltpepper", "circular_accuracy", 0.40),
    ]), _long([
        ("m1", "mc_verb", "clean", "circular_accuracy", 0.54),
        ("m1", "yn_verb", "clean", "accuracy", 0.65),
        ("m1", "mc_verb", "crop", "circular_accuracy", 0.11),  # (a crop's subsets are not read)
    ]).assign(subset="single_instance")], ignore_index=True)
    two = paper_tables(metrics, load_paper_numbers(packaged_paper_numbers()), ["m1"], {},
                       [("clean", "saltpepper"), ("clean", "crop"), ("crop", "clean")],
                       partial_conditions=["crop"])[2].frame
    ours = two[two.source.eq("measured")].set_index(["reference", "other"])
    assert ours.at[("clean", "saltpepper"), "mc_acc_ref"] == pytest.approx(59.0)  # no crop: all images
    assert ours.at[("clean", "crop"), "mc_acc_ref"] == pytest.approx(54.0)
    assert ours.at[("clean", "crop"), "yn_acc_ref"] == pytest.approx(65.0)
    assert ours.at[("clean", "crop"), "mc_acc_other"] == pytest.approx(50.0)
    assert ours.at[("crop", "clean"), "mc_acc_ref"] == pytest.approx(50.0)
    assert ours.at[("crop", "clean"), "mc_acc_other"] == pytest.approx(54.0)


def test_measured_rows_refuse_duplicate_keys():
    metrics = _long([("m1", "yn_obj", "clean", "accuracy", 0.5), ("m1", "yn_obj", "clean", "accuracy", 0.7)])
    with pytest.raises(ValueError, match=r"1 key\(s\) appear more than once.*'model': 'm1', 'variant': 'default', "
                                         r"'qset': 'yn_obj', 'condition': 'clean', 'metric': 'accuracy'"):
        measured_rows(metrics, table1_columns(), ["m1"])
    # the same key in another subset is another cell
    other = _long([("m1", "yn_obj", "clean", "accuracy", 0.5)]).assign(subset="rare")
    table = measured_rows(pd.concat([metrics.iloc[:1], other]), table1_columns(), ["m1"])
    assert table.at[0, "yn_obj_acc"] == pytest.approx(50.0)


# ---- the paper's rows beside ours -----------------------------------------------------------------------
PAPER = load_paper_numbers(packaged_paper_numbers())


def test_every_published_row_of_tables_1_to_4_is_in_our_tables():
    metrics = _long([("m1", "yn_obj", "clean", "accuracy", 0.5)]).pipe(
        lambda f: pd.concat([f, f.assign(dataset="charadesego", qset="yn_ego")]))
    tables = paper_tables(metrics, PAPER, ["m1"], {}, [("clean", "saltpepper")])
    for number in (1, 2, 3, 4):
        published = PAPER[PAPER.table == str(number)]
        frame = tables[number].frame
        paper = frame[frame.source.eq("paper")]
        assert set(paper.model) == set(published.model), number
        for entry in published.itertuples():  # every published number sits in its column
            column = next(c for c in tables[number].columns if c.paper_key() == (entry.qset, entry.condition,
                                                                                  entry.metric))
            assert paper.set_index("model").at[entry.model, column.label] == pytest.approx(entry.value)
    assert set(tables[2].frame[tables[2].frame.source.eq("paper")].other) == {"saltpepper"}


def test_the_difference_is_shown_where_model_and_variant_names_match():
    metrics = pd.concat([_long([("llava", "yn_obj", "clean", "accuracy", 0.60)]).assign(variant=v, ci_low=0.55,
                                                                                          ci_high=0.65)
                         for v in ("default", "beam")])
    tables = paper_tables(metrics, PAPER, ["llava"], {}, [], variants=["default", "beam"],
                          paper_names={"llava": "LLaVA-1.5-7B"})
    shown = tables[1].display({"beam": "beam5"})
    assert shown.source.tolist()[:4] == ["measured", "measured", "paper", "Δ (ours − paper)"]
    assert shown.at[0, "yn_obj_acc"] == "60.00 [55.00, 65.00]"  # greedy: no paper row of that decoding
    assert shown.at[2, "model"] == "LLaVA-1.5-7B" and shown.at[2, "yn_obj_acc"] == "52.16"
    assert shown.at[3, "yn_obj_acc"] == "+7.84" and shown.at[3, "variant"] == "beam"
    assert shown.source.tolist().count("paper") == 7  # each published model once: the matched one moved up


def test_rows_of_a_stand_in_and_their_difference_to_the_paper_say_so():
    from verbmirage.evaluation.mitigation_tables import table8

    metrics = _long([("llava", "yn_obj", "clean", "accuracy", 0.6), ("m2", "yn_obj", "clean", "accuracy", 0.5)]
                    ).assign(variant="beam")
    names = {"llava": "LLaVA-1.5-7B", "m2": "LLaVA-1.5-7B"}
    tables = paper_tables(metrics, PAPER, ["llava", "m2"], {}, [], variants=["beam"], paper_names=names,
                          stand_ins={"llava": "random weights"})
    shown = tables[1].display({"beam": "beam5"})
    caveat = "stand-in, not a model's result (random weights)"
    ours = shown[shown.source.eq("measured")].set_index("model").note
    assert ours.to_dict() == {"llava": caveat, "m2": ""}
    assert shown[shown.source.eq("Δ (ours − paper)")].note.tolist() == [caveat, ""]  # llava's difference, m2's
    assert (shown[shown.source.eq("paper")].note == "").all()
    eight = table8(metrics, PAPER, ["llava"], {"beam": "beam5"}, names, stand_ins={"llava": "random weights"})
    assert eight.frame[eight.frame.source.eq("measured")].note.tolist() == [caveat]


def test_undefined_values_print_as_a_dash(tmp_path):
    from verbmirage.core.io import MISSING_VALUE, write_html, write_markdown

    metrics = _long([("m1", "yn_obj", "clean", "accuracy", 0.5), ("m1", "yn_obj", "clean", "precision", np.nan)])
    table = paper_tables(metrics, PAPER.iloc[:0], ["m1"], {}, [])[1]
    assert np.isnan(table.frame.at[0, "yn_obj_prec"])  # undefined stays NaN in the Parquet table
    write_markdown(table.display(), tmp_path / "t.md")
    write_html(table.display(), tmp_path / "t.html")
    row = (tmp_path / "t.md").read_text().splitlines()[-1]
    assert "50.00" in row and MISSING_VALUE in row and "nan" not in row
    assert f">{MISSING_VALUE}</td>" in (tmp_path / "t.html").read_text()


def test_html_tables_align_numbers_and_put_each_interval_on_its_own_line(tmp_path):
    from verbmirage.core.io import html_table, write_html

    metrics = _long([("llava", "yn_obj", "clean", "accuracy", 0.6)]).assign(ci_low=0.55, ci_high=0.65, variant="beam")
    table = paper_tables(metrics, PAPER, ["llava"], {}, [], variants=["beam"], paper_names={"llava": "LLaVA-1.5-7B"})
    write_html(table[1].display({"beam": "beam5"}), tmp_path / "t.html", title="Table 1 <clean>")
    page = (tmp_path / "t.html").read_text()
    assert "<td class='num'>60.00<span class='ci'>[55.00, 65.00]</span></td>" in page
    assert "<tr class='paper'>" in page and "<tr class='delta'>" in page and "<td>LLaVA-1.5-7B</td>" in page
    assert "<h2>Table 1 &lt;clean&gt;</h2>" in page and "font-variant-numeric: tabular-nums" in page
    # a note (why a row is a stand-in or has no value) wraps in a column wide enough to read, not one word a line
    noted = html_table(pd.DataFrame({"source": ["measured"], "acc": ["1.00"], "note": ["stand-in (random weights)"]}))
    assert "<td class='note'>stand-in (random weights)</td>" in noted and "td.note { min-width" in page
    # so does a long label (Table 5's method of a variant of the paper's recipe, with its departures)
    method = "Pangea-LoRA (variant of the paper's method: Yes:No 1:2; 24 questions, not 60K + 60K; lr 1e-3)"
    assert f"<td class='long'>{method.replace(chr(39), '&#x27;')}</td>" in html_table(pd.DataFrame({"method": [method]}))
    assert "<td>LLaVA-1.5-7B</td>" in page and "td.long { min-width" in page


def test_a_configured_model_without_values_keeps_its_row_with_the_reason(tmp_path):
    """a model whose every metric is NaN vanished from Table 1, like a
    model that never ran. Both keep their rows, "–" in every cell and the reason in ``note``; a pair the config
    never plans (a baseline under beam search) stays out."""
    from verbmirage.core.io import MISSING_VALUE, write_markdown
    from verbmirage.evaluation.tables import NO_VALUES, NOT_RUN

    metrics = _long([("m1", "yn_obj", "clean", "accuracy", 0.5), ("m1", "yn_verb", "clean", "accuracy", 0.6),
                     ("all_nan", "yn_obj", "clean", "accuracy", np.nan), ("all_nan", "yn_obj", "clean", "recall", np.nan),
                     ("all_nan", "yn_verb", "clean", "accuracy", np.nan)])
    planned = [("hico", "clean", model, "default", qset) for model in ("m1", "all_nan", "absent")
               for qset in ("yn_obj", "yn_verb")]
    planned += [("hico", "clean_vs_saltpepper", model, "default", "yn_verb") for model in ("m1", "absent")]
    tables = paper_tables(metrics, PAPER.iloc[:0], ["m1", "all_nan", "absent", "unplanned"], {"vote": ["m1", "absent"]},
                          [("clean", "saltpepper")], planned=planned)
    one = tables[1].frame.set_index("model")
    assert one.index.tolist() == ["m1", "all_nan", "absent"]
    assert one.note.fillna("").tolist() == ["", NO_VALUES, NOT_RUN]
    assert one.loc[["all_nan", "absent"], "yn_obj_acc"].isna().all()
    shown = tables[1].display()
    assert shown.note.tolist() == ["", NO_VALUES, NOT_RUN]
    assert (shown.loc[1:, "yn_obj_acc"] == MISSING_VALUE).all() and shown.at[0, "yn_obj_acc"] == "50.00"
    write_markdown(shown, tmp_path / "t1.md")
    lines = (tmp_path / "t1.md").read_text().splitlines()
    assert any("all_nan" in line and NO_VALUES in line and MISSING_VALUE in line for line in lines)
    assert any("absent" in line and NOT_RUN in line for line in lines)
    assert not any("unplanned" in line for line in lines)
    # Table 2 (per condition pair) and Table 3 (ensemble members) follow the same rule
    two = tables[2].frame
    assert two[two.source.eq("measured")].set_index("model").note.fillna("").to_dict() == {
        "m1": "", "all_nan": NO_VALUES, "absent": NOT_RUN}  # all_nan: its clean yn_verb accuracy is stored, NaN
    three = tables[3].frame
    assert three[three.source.eq("measured")].set_index("model").note.fillna("").to_dict() == {"m1": "",
                                                                                             "absent": NOT_RUN}
    # without the plan, only the stored all-NaN row is told apart from nothing
    bare = paper_tables(metrics, PAPER.iloc[:0], ["m1", "all_nan", "absent"], {}, [])[1].frame
    assert bare.model.tolist() == ["m1", "all_nan"]
