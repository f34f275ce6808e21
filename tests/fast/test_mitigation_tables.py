"""Paper Tables 5 and 8 from a synthetic long metrics table: values, Δ placement, the paper-only rows,
Table 5's ``none`` = beam5 row, the ``paper_method`` model rows and Appendix F's prompt-suffix group."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from verbmirage.core.io import MISSING_VALUE, read_table, write_table
from verbmirage.core.schemas import DECODING_TABLE8, MITIGATION_TABLE5
from verbmirage.evaluation.mitigation_tables import (
    PROMPT_GROUP,
    PROMPT_SUFFIX_METHOD,
    TABLE5_GROUP,
    table5,
    table5_runs,
    table8,
)
from verbmirage.evaluation.paper_methods import paper_method_pairs, paper_methods_from_config
from verbmirage.benchmark.pangea_settings import PAPER_MC_STEM
from verbmirage.evaluation.paper_numbers import load_paper_numbers, packaged_paper_numbers

PAPER = load_paper_numbers(packaged_paper_numbers())
DELTA = "Δ (ours − paper)"
#: our variant slug -> its paper_name (as configs/paper.yaml sets them)
VARIANT_NAMES = {"default": "", "beam5": "beam5", "vcd_beam": "VCD", "opera": "OPERA", "sample": "sampling",
                 "sample_vcd": "sampling+VCD", "verb_prompt": PROMPT_SUFFIX_METHOD}
#: a Nullu built from LURE's caption pairs, the official Nullu's data (a LURE-format jsonl and its images)
LURE = {"pairs_file": "lure/hallucination_pairs.jsonl", "image_root": "coco/train2014"}
SETS = [("yn_obj", "accuracy"), ("yn_obj", "precision"), ("yn_obj", "recall"), ("yn_obj", "f1"),
        ("yn_verb", "accuracy"), ("yn_verb", "precision"), ("yn_verb", "recall"), ("yn_verb", "f1"),
        ("mc_obj", "circular_accuracy"), ("mc_verb", "circular_accuracy")]


def _long(runs: dict[tuple[str, str], float]) -> pd.DataFrame:
    """Every Table 5/8 metric of each (model, variant) run at one value (a fraction), interval ±0.01."""
    rows = [dict(dataset="hico", subset="all", model=model, variant=variant, qset=qset, condition="clean",
                 metric=metric, value=value, ci_low=value - 0.01, ci_high=value + 0.01, n=10)
            for (model, variant), value in runs.items() for qset, metric in SETS]
    if rows:
        rows.append({**rows[0], "subset": "rare", "value": 0.99})  # another subset: never read
    return pd.DataFrame(rows, columns=["dataset", "subset", "model", "variant", "qset", "condition", "metric",
                                       "value", "ci_low", "ci_high", "n"])


def _block(shown: pd.DataFrame, **keys) -> pd.DataFrame:
    mask = np.logical_and.reduce([shown[k] == v for k, v in keys.items()])
    return shown[mask]


# ---- Table 8 -----------------------------------------------------------------------------------------------
def test_table8_rows_values_and_difference():
    metrics = _long({("llava", "beam5"): 0.60, ("llava", "sample"): 0.50, ("llava", "sample_vcd"): 0.55,
                     ("llava", "default"): 0.70, ("llava", "opera"): 0.40, ("qwen2", "beam5"): 0.80})
    table = table8(metrics, PAPER, ["llava", "qwen2", "not_run"], VARIANT_NAMES,
                   paper_names={"llava": "LLaVA-1.5-7B", "qwen2": "Qwen2-VL-7B"})
    frame = table.frame
    ours = frame[frame.source == "measured"]
    # only the paper's decodings (greedy default and OPERA are not Table 8), in the paper's order per model
    assert list(zip(ours.model, ours.variant, ours.decoding)) == [
        ("llava", "sample", "sampling"), ("llava", "sample_vcd", "sampling+VCD"), ("llava", "beam5", "beam5"),
        ("qwen2", "beam5", "beam5")]
    beam = ours.set_index(["model", "variant"]).loc[("llava", "beam5")]
    assert beam.yn_obj_acc == pytest.approx(60.0) and beam.mc_verb_acc == pytest.approx(60.0)
    assert beam.yn_verb_recall_ci_low == pytest.approx(59.0) and beam.yn_verb_recall_ci_high == pytest.approx(61.0)
    # every published row, paper-only where nothing of ours matches
    paper = frame[frame.source == "paper"]
    assert len(paper) == 9 and set(paper.decoding) == {"sampling", "sampling+VCD", "beam5"}

    shown = table.display(VARIANT_NAMES)
    rows = list(zip(shown.source, shown.model, shown.decoding))
    at = rows.index(("measured", "llava", "sampling+VCD"))
    assert rows[at + 1] == ("paper", "LLaVA-1.5-7B", "sampling+VCD") and rows[at + 2][0] == DELTA
    assert shown.at[at + 1, "mc_obj_acc"] == "46.41" and shown.at[at + 2, "mc_obj_acc"] == "+8.59"
    assert shown.at[at, "yn_obj_acc"] == "55.00 [54.00, 56.00]"
    # Qwen2-VL is not in the paper's Table 8: our row, no difference
    qwen = rows.index(("measured", "qwen2", "beam5"))
    assert rows[qwen + 1][0] != DELTA
    # the paper rows not matched come last, each once
    assert [r[0] for r in rows].count("paper") == 9 and [r[0] for r in rows].count(DELTA) == 3
    assert all(r[0] == "paper" for r in rows[-6:])


def test_table8_holds_every_published_number():
    table = table8(_long({}), PAPER, ["m"], VARIANT_NAMES)
    paper = table.frame.set_index(["model", "decoding"])
    published = PAPER[PAPER.table == "8"]
    assert len(published) == 9 * 8
    for entry in published.itertuples():
        column = next(c for c in table.columns if c.paper_key() == (entry.qset, entry.condition, entry.metric))
        assert paper.at[(entry.model, entry.variant), column.label] == pytest.approx(entry.value)
    assert (table.display(VARIANT_NAMES).source == "paper").all()


# ---- Table 5 -----------------------------------------------------------------------------------------------
def test_table5_none_is_the_beam5_variant_and_methods_follow_the_paper_order():
    metrics = _long({("llava", "default"): 0.70, ("llava", "beam5"): 0.60, ("llava", "opera"): 0.45,
                     ("llava", "vcd_beam"): 0.55, ("llava", "sample"): 0.50})
    table = table5(metrics, PAPER, ["llava"], VARIANT_NAMES, paper_names={"llava": "LLaVA-1.5-7B"})
    ours = table.frame[table.frame.source == "measured"]
    # greedy (ours) and sampling (Table 8) are not Table 5 rows; beam5 is the paper's "none"
    assert list(zip(ours.method, ours.variant)) == [("none", "beam5"), ("OPERA", "opera"), ("VCD", "vcd_beam")]
    assert set(ours.group) == {TABLE5_GROUP}
    assert ours.set_index("method").at["VCD", "yn_verb_f1"] == pytest.approx(55.0)

    shown = table.display(VARIANT_NAMES)
    none = _block(shown, method="none", group=TABLE5_GROUP)
    assert none.source.tolist() == ["measured", "paper", DELTA]
    assert none.variant.tolist() == ["beam5", "none", "beam5"]
    assert none.yn_obj_acc.tolist() == ["60.00 [59.00, 61.00]", "52.16", "+7.84"]
    assert _block(shown, method="OPERA", source=DELTA).yn_obj_f1.item() == "-8.69"  # 45 - 53.69
    # the paper's model rows nobody ran: paper only, after ours
    for method in ("REVERIE", "HaloQuest", "Nullu", "Octopus", "Pangea-LoRA (paper's method)"):
        assert _block(shown, method=method).source.tolist() == ["paper"]


def test_table5_paper_method_models_land_in_their_row():
    metrics = _long({("llava", "beam5"): 0.60, ("llava_nullu", "beam5"): 0.52, ("llava_nullu", "default"): 0.9,
                     ("llava_nullu", "vcd_beam"): 0.3, ("llava_pangea", "beam5"): 0.80})
    config = {"models": {
        "llava": {"backend": "llava", "paper_name": "LLaVA-1.5-7B"},
        "llava_nullu": {"backend": "llava", "paper_method": "Nullu"},
        "llava_pangea": {"backend": "llava", "paper_method": "Pangea-LoRA (paper's method)"}}}
    derived = {"llava_nullu": {"method": "nullu", "base": "llava", **LURE},
               "llava_pangea": {"method": "lora_finetune", "base": "llava",
                                "pangea": {"negatives_per_positive": 19, "mc_stem": PAPER_MC_STEM}}}
    methods = paper_methods_from_config(config, derived)
    table = table5(metrics, PAPER, ["llava", "llava_nullu", "llava_pangea"], VARIANT_NAMES,
                   paper_names={"llava": "LLaVA-1.5-7B"}, paper_methods=methods,
                   method_pairs=paper_method_pairs(config, methods, derived))
    ours = table.frame[table.frame.source == "measured"]
    # a paper_method model is its method under the paper's decoding (beam5) only; compared with LLaVA-1.5-7B's row
    # because its base is the paper's LLaVA-1.5-7B
    assert list(zip(ours.method, ours.model, ours.variant)) == [
        ("none", "llava", "beam5"), ("Nullu", "llava_nullu", "beam5"),
        ("Pangea-LoRA (paper's method)", "llava_pangea", "beam5")]
    assert ours.set_index("model").at["llava_nullu", "paper_name"] == "LLaVA-1.5-7B"
    shown = table.display(VARIANT_NAMES)
    nullu = _block(shown, method="Nullu")
    assert nullu.source.tolist() == ["measured", "paper", DELTA]
    assert nullu.mc_verb_acc.tolist()[1:] == ["53.17", "-1.17"]
    pangea = _block(shown, method="Pangea-LoRA (paper's method)")
    assert pangea.yn_obj_acc.tolist()[1:] == ["78.48", "+1.52"]


def test_table5_pairs_a_method_row_only_on_the_papers_model_and_mix():
    """A Nullu built from a model that is not the paper's LLaVA-1.5-7B (a random-weight demo model, a Qwen2-VL)
    and a Pangea fine-tune on another training mix get the paper's rows beside them, unpaired: no difference
    against another model's or another method's number."""
    metrics = _long({("tiny", "beam5"): 0.5, ("tiny_nullu", "beam5"): 0.2, ("tiny_pangea", "beam5"): 0.3})
    config = {"models": {"tiny": {"backend": "llava"}, "tiny_nullu": {"backend": "llava", "paper_method": "Nullu"},
                         "tiny_pangea": {"backend": "llava", "paper_method": "Pangea-LoRA (paper's method)"}}}
    derived = {"tiny_nullu": {"method": "nullu", "base": "tiny", **LURE},
               "tiny_pangea": {"method": "lora_finetune", "base": "tiny", "pangea": {"yn_questions": 24}}}
    methods = paper_methods_from_config(config, derived)
    variant = methods["tiny_pangea"]
    assert variant.startswith("Pangea-LoRA (variant of the paper's method: Yes:No 1:2, the paper's 1:19; "
                              "another MC stem; ") and "24 YN" in variant
    assert paper_method_pairs(config, methods, derived) == {}
    table = table5(metrics, PAPER, ["tiny", "tiny_nullu", "tiny_pangea"], VARIANT_NAMES, paper_methods=methods,
                   method_pairs=paper_method_pairs(config, methods, derived))
    shown = table.display(VARIANT_NAMES)
    assert DELTA not in set(shown.source)
    assert _block(shown, method="Nullu").source.tolist() == ["measured", "paper"]
    assert _block(shown, method=variant).source.tolist() == ["measured"]
    assert _block(shown, method="Pangea-LoRA (paper's method)").source.tolist() == ["paper"]
    # the same Nullu on the paper's model is paired
    config["models"]["tiny"]["paper_name"] = "LLaVA-1.5-7B"
    assert paper_method_pairs(config, methods, derived) == {"tiny_nullu": "LLaVA-1.5-7B"}


def test_a_method_model_pairs_by_its_base_through_the_tables_one_rule():
    """An adapter entry (no derive) is its own base: its paper_name decides, as a derived model's base's does; a
    method on another paper model is not paired either (the paper's method rows are LLaVA-1.5-7B's). The rule
    is the tables' one (paper_names_from_config): with the derive block inside the entry as well."""
    metrics = _long({("nullu", "beam5"): 0.40, ("adapter", "beam5"): 0.45})

    def shown(base_name: str | None) -> pd.DataFrame:
        named = {"paper_name": base_name} if base_name else {}
        config = {"models": {"base": {"backend": "llava", **named},
                             "nullu": {"derive": {"method": "nullu", "base": "base", **LURE}, "paper_method": "Nullu"},
                             "adapter": {"backend": "llava", "adapter": "a/lora", "paper_method": "REVERIE",
                                         **named}}}
        methods = paper_methods_from_config(config)
        return table5(metrics, PAPER, ["base", "nullu", "adapter"], VARIANT_NAMES, paper_methods=methods,
                      method_pairs=paper_method_pairs(config, methods)).display(VARIANT_NAMES)

    for base_name in (None, "Qwen2-VL-7B"):
        assert DELTA not in set(shown(base_name).source)
    paired = shown("LLaVA-1.5-7B")
    assert _block(paired, method="Nullu").yn_obj_acc.tolist()[1:] == ["51.99", "-11.99"]
    assert _block(paired, method="REVERIE", source=DELTA).yn_obj_acc.item() == "+4.33"  # 45 - 40.67


def test_a_nullu_off_the_official_data_or_settings_is_a_variant_of_nullu_and_unpaired():
    """The official Nullu computes its HalluSpace from LURE's caption pairs (the paper does not say which data its
    Nullu row used): a Nullu from HICO training pairs, even on the paper's LLaVA-1.5-7B, is named a variant of
    Nullu, beside the paper's row without a difference, as a departing Pangea build; so is one off the official
    top-k, layers or embedding. A LURE-format file keeps the label and the pairing."""
    metrics = _long({("llava", "beam5"): 0.60, ("nullu", "beam5"): 0.52})
    config = {"models": {"llava": {"backend": "llava", "paper_name": "LLaVA-1.5-7B"},
                         "nullu": {"backend": "llava", "paper_method": "Nullu"}}}
    hico = {"nullu": {"method": "nullu", "base": "llava", "pairs": 5000}}
    methods = paper_methods_from_config(config, hico)
    assert methods["nullu"] == ("Nullu (variant of the official method: HalluSpace from HICO training pairs, the "
                                "official one from LURE's captions)")
    assert paper_method_pairs(config, methods, hico) == {}
    shown = table5(metrics, PAPER, ["llava", "nullu"], VARIANT_NAMES, paper_names={"llava": "LLaVA-1.5-7B"},
                   paper_methods=methods, method_pairs={}).display(VARIANT_NAMES)
    assert _block(shown, method=methods["nullu"]).source.tolist() == ["measured"]  # no paper row, no difference
    assert _block(shown, method="Nullu").source.tolist() == ["paper"]
    runs = table5_runs({("llava", "beam5"), ("nullu", "beam5"), ("ours", "beam5")}, ["ours", "nullu", "llava"],
                       VARIANT_NAMES, {"llava": "LLaVA-1.5-7B"}, {**methods, "ours": "Pangea-LoRA (paper's method)"})
    assert [run["model"] for run in runs] == ["llava", "nullu", "ours"]  # the variant keeps Nullu's place
    off = {"nullu": {"method": "nullu", "base": "llava", **LURE, "top_k": 8, "layers": [30, 31],
                     "embedding": "last", "prompt": "Describe."}}
    assert paper_methods_from_config(config, off)["nullu"] == (
        "Nullu (variant of the official method: prompt 'Describe.', LURE's 'Please describe this image in "
        "detail.'; top_k 8, the official 4; layers [30, 31], the official upper half (16-31 of 32); embedding "
        "last, the official mean)")
    official = {"nullu": {"method": "nullu", "base": "llava", **LURE}}
    methods = paper_methods_from_config(config, official)
    assert methods["nullu"] == "Nullu" and paper_method_pairs(config, methods, official) == {"nullu": "LLaVA-1.5-7B"}


def test_every_departure_from_the_papers_fine_tune_names_a_variant():
    """Appendix D's recipe: 60K MC + 60K YN questions with four options, its YN prompt and MC stem, Yes:No
    about 1:19, Kinetics-700 and HAKE left out, lr 2e-5, batch 64. Each departure is named; the paper's recipe
    keeps the paper's name; a fine-tune the user brings (an adapter) is taken at its label."""
    paper = {"method": "lora_finetune", "base": "llava",
             "pangea": {"negatives_per_positive": 19, "mc_stem": PAPER_MC_STEM}}
    config = {"models": {"llava": {"backend": "llava", "paper_name": "LLaVA-1.5-7B"},
                         "ft": {"paper_method": "Pangea-LoRA (paper's method)"}}}

    def named(derive: dict) -> str:
        return paper_methods_from_config(config, {"ft": derive})["ft"]

    assert named(paper) == "Pangea-LoRA (paper's method)"
    for change, phrase in (
        ({"learning_rate": 1e-3}, "lr 0.001, the paper's 2e-5"),
        ({"batch_size": 8}, "batch 8, the paper's 64"),
        ({"pangea": {**paper["pangea"], "mc_options": 3}}, "3 MC options, the paper's 4"),
        ({"pangea": {**paper["pangea"], "yn_prompt": "Is the person {action}?"}}, "another YN prompt"),
        ({"pangea": {**paper["pangea"], "exclude_sources": ["hico*"]}}, "Kinetics-700 and HAKE not left out"),
        ({"method": "nullu"}, "built by nullu, not a LoRA fine-tune"),
    ):
        name = named({**paper, **change})
        assert name == f"Pangea-LoRA (variant of the paper's method: {phrase})", change
        assert paper_method_pairs({"models": {**config["models"], "ft": {**config["models"]["ft"],
                                                                          "derive": {**paper, **change}}}},
                                  {"ft": name}) == {}
    # the derive block inside the entry (the config as written) is read as well
    inside = {"models": {**config["models"], "ft": {**config["models"]["ft"], "derive": {**paper, "batch_size": 32,
                                                                                        "micro_batch_size": 8}}}}
    assert paper_methods_from_config(inside)["ft"].endswith("(variant of the paper's method: batch 32, the paper's 64)")
    brought = {"models": {"m": {"backend": "llava", "adapter": "x", "paper_method": "Pangea-LoRA (paper's method)"}}}
    assert paper_methods_from_config(brought)["m"] == "Pangea-LoRA (paper's method)"


def test_table5_scope_without_paper_names():
    """A model that ran a mitigation is in Table 5 with its baseline (no paper name: no difference); a model
    that ran only the paper's decoding (a Table 1 row) is not."""
    metrics = _long({("tiny_llava", "beam5"): 0.5, ("tiny_llava", "vcd_beam"): 0.6, ("qwen2", "beam5"): 0.7})
    table = table5(metrics, PAPER, ["tiny_llava", "qwen2"], VARIANT_NAMES)
    ours = table.frame[table.frame.source == "measured"]
    assert list(zip(ours.model, ours.method)) == [("tiny_llava", "none"), ("tiny_llava", "VCD")]
    assert DELTA not in set(table.display(VARIANT_NAMES).source)


def test_table5_prompt_suffix_group():
    metrics = _long({("llava", "beam5"): 0.60, ("llava", "verb_prompt"): 0.61})
    table = table5(metrics, PAPER, ["llava"], VARIANT_NAMES, paper_names={"llava": "LLaVA-1.5-7B"})
    shown = table.display(VARIANT_NAMES)
    prompt = _block(shown, group=PROMPT_GROUP)
    assert prompt.source.tolist() == ["measured", "paper", DELTA]
    assert set(prompt.method) == {PROMPT_SUFFIX_METHOD}
    # Appendix F prints the two YN F1 only
    assert prompt.yn_obj_f1.tolist()[1:] == ["57.50", "+3.50"] and prompt.yn_verb_f1.tolist()[1] == "62.40"
    assert prompt.yn_obj_acc.tolist()[1:] == [MISSING_VALUE, MISSING_VALUE]
    # the group follows all of Table 5's rows, the paper-only ones included; Appendix F's Qwen2.5-VL row last
    assert shown.group.tolist()[-4:] == [PROMPT_GROUP] * 3 + ["Appendix F (Qwen2.5-VL-7B)"]
    assert set(shown.group[:-4]) == {TABLE5_GROUP}


def test_table5_groups_keep_their_order_when_only_the_prompt_ran():
    metrics = _long({("llava", "verb_prompt"): 0.61})
    shown = table5(metrics, PAPER, ["llava"], VARIANT_NAMES, paper_names={"llava": "LLaVA-1.5-7B"}).display()
    assert shown.group.tolist() == [TABLE5_GROUP] * 8 + [PROMPT_GROUP] * 3 + ["Appendix F (Qwen2.5-VL-7B)"]


def test_table5_paper_rows_when_nothing_maps(tmp_path):
    metrics = _long({("llava", "default"): 0.70})  # greedy only: no Table 5 row
    table = table5(metrics, PAPER, ["llava"], VARIANT_NAMES, paper_names={"llava": "LLaVA-1.5-7B"})
    frame = table.frame
    assert (frame.source == "paper").all()
    assert frame.method.tolist() == ["none", "OPERA", "VCD", "REVERIE", "HaloQuest", "Nullu", "Octopus",
                                     "Pangea-LoRA (paper's method)", PROMPT_SUFFIX_METHOD, "none"]
    assert frame.group.tolist()[-1] == "Appendix F (Qwen2.5-VL-7B)"
    published = PAPER[PAPER.table == "5"]
    table5_rows = frame[frame.group == TABLE5_GROUP].set_index("method")
    for entry in published.itertuples():
        column = next(c for c in table.columns if c.paper_key() == (entry.qset, entry.condition, entry.metric))
        assert table5_rows.at[entry.variant, column.label] == pytest.approx(entry.value)
    # the Parquet schemas hold exactly these columns (measured rows included)
    write_table(frame, tmp_path / "t5.parquet", MITIGATION_TABLE5)
    assert read_table(tmp_path / "t5.parquet").method.tolist() == frame.method.tolist()
    full = table5(_long({("llava", "beam5"): 0.6}), PAPER, ["llava"], VARIANT_NAMES).frame
    assert set(full.columns) == set(MITIGATION_TABLE5.names)
    eight = table8(_long({("llava", "beam5"): 0.6}), PAPER, ["llava"], VARIANT_NAMES).frame
    assert set(eight.columns) == set(DECODING_TABLE8.names)
    write_table(eight, tmp_path / "t8.parquet", DECODING_TABLE8)


def test_paper_method_must_be_a_table5_model_row():
    with pytest.raises(ValueError, match=r"models\.m\.paper_method: 'Nulu' is not a model row"):
        paper_methods_from_config({"models": {"m": {"backend": "llava", "paper_method": "Nulu"}}})
    with pytest.raises(ValueError, match=r"models\.m\.paper_method: 'VCD'.*a variant's paper_name"):
        paper_methods_from_config({"models": {"m": {"backend": "llava", "paper_method": "VCD"}}})
    assert paper_methods_from_config({"models": {"m": {"backend": "llava"}}}) == {}


def test_tables_5_and_8_keep_planned_runs_without_values_with_the_reason(tmp_path):
    """As Table 1: an all-NaN run and a planned run without metrics
    keep their rows, "–" and the reason; the Parquet schemas hold the reason."""
    from verbmirage.evaluation.tables import NO_VALUES, NOT_RUN

    metrics = _long({("llava", "beam5"): 0.6, ("llava", "vcd_beam"): float("nan")})
    planned = [("hico", "clean", "llava", variant, qset) for variant in ("beam5", "vcd_beam", "opera", "sample")
               for qset, _ in SETS]
    five = table5(metrics, PAPER, ["llava"], VARIANT_NAMES, planned=planned)
    ours = five.frame[five.frame.source == "measured"].set_index("method")
    assert ours.note.fillna("").to_dict() == {"none": "", "OPERA": NOT_RUN, "VCD": NO_VALUES}
    assert ours.loc[["OPERA", "VCD"], "yn_obj_acc"].isna().all()
    shown = five.display(VARIANT_NAMES)
    assert shown[shown.source == "measured"].note.tolist() == ["", NOT_RUN, NO_VALUES]
    assert (shown.note[shown.source == "paper"] == "").all()
    assert (shown[shown.model.eq("llava") & shown.note.ne("")].yn_obj_acc == MISSING_VALUE).all()
    write_table(five.frame, tmp_path / "t5.parquet", MITIGATION_TABLE5)
    stored = read_table(tmp_path / "t5.parquet", MITIGATION_TABLE5)
    assert stored[stored.source == "measured"].note.fillna("").tolist() == ["", NOT_RUN, NO_VALUES]
    eight = table8(metrics, PAPER, ["llava"], VARIANT_NAMES, planned=planned)
    ours = eight.frame[eight.frame.source == "measured"].set_index("decoding")
    assert ours.note.fillna("").to_dict() == {"sampling": NOT_RUN, "beam5": ""}
    write_table(eight.frame, tmp_path / "t8.parquet", DECODING_TABLE8)


def test_appendix_f_has_a_cell_for_qwen25_vl_f1():
    """Appendix F prints Qwen2.5-VL-7B's YN F1 (73.79 with the object, 71.99 without): a model whose paper_name is
    Qwen2.5-VL-7B gets its beam5 row beside them, with the difference."""
    metrics = _long({("qwen25", "beam5"): 0.70, ("qwen25", "default"): 0.9})
    table = table5(metrics, PAPER, ["qwen25"], VARIANT_NAMES, paper_names={"qwen25": "Qwen2.5-VL-7B"})
    shown = table.display(VARIANT_NAMES)
    block = _block(shown, group="Appendix F (Qwen2.5-VL-7B)")
    assert block.source.tolist() == ["measured", "paper", DELTA] and block.variant.tolist()[0] == "beam5"
    assert block.yn_obj_f1.tolist()[1:] == ["73.79", "-3.79"] and block.yn_verb_f1.tolist()[1:] == ["71.99", "-1.99"]
    without = table5(_long({}), PAPER, [], VARIANT_NAMES).display(VARIANT_NAMES)
    assert _block(without, group="Appendix F (Qwen2.5-VL-7B)").source.tolist() == ["paper"]
