"""Table schemas, declared once: every Parquet artifact of the workflow is written and read against one of
these (:func:`verbmirage.core.io.write_table`, :func:`verbmirage.core.io.read_table`). The question table's
schema lives with its value checks in :mod:`verbmirage.benchmark.question_table`.
"""

from __future__ import annotations

import pyarrow as pa

PREDICTIONS = pa.schema(
    [
        ("question_id", pa.string()),
        ("raw_answer", pa.string()),
        ("prediction", pa.string()),
        ("parse_rule", pa.string()),
        ("p_yes", pa.float64()),
        # logsumexp(z[yes]) - logsumexp(z[no]) at the first answer position (float64): sigmoid of it is p_yes,
        # finite where p_yes saturates at 1.0; null without yes/no logits (baselines, parsed text, MC rows)
        ("yes_margin", pa.float64()),
        # P(Yes) not renormalised: the probability mass of the yes tokens over the whole vocabulary at the first
        # answer position (the paper's Known-Object ranking score, read literally); null where the backend has
        # no logits; an API's is the mass of the yes tokens among the top logprobs it returns
        ("yes_mass", pa.float64()),
        ("option_probs", pa.list_(pa.float64())),
        ("confidence", pa.float64()),
        ("error", pa.string()),
        # VCD variants (docs/variants.md), first answer position: KL(q || p~) of the contrasted
        # distribution q against the plain one restricted to the plausibility set and renormalised, and the size
        # of that set (tokens with p >= beta * p_max); null without VCD
        ("vcd_kl", pa.float64()),
        ("vcd_plausible", pa.int64()),
        # the other direction, KL(p~ || q): the paper's "KL divergence between the original p_theta and the
        # contrasted p_vcd" names no direction (its wording reads as this one), so both are kept
        # (docs/analysis.md, "VCD divergence")
        ("vcd_kl_reverse", pa.float64()),
        # the SHA-256 of the image the question was asked on (the condition manifest's ``sha256``): a resumed
        # job asks again every question whose image has changed since; null for a model that sees no image
        ("image_sha256", pa.string()),
    ]
)


METRICS = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("variant", pa.string()),
        ("subset", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n", pa.int64()),
    ]
)


QUESTION_COUNTS = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("rows", pa.int64()),
        ("unique_questions", pa.int64()),
        ("images", pa.int64()),
        ("yes", pa.int64()),
        ("no", pa.int64()),
        ("yes_share", pa.float64()),  # yes / (yes + no): 1/3 is the paper's 1:2
        ("paper_unique_questions", pa.int64()),
        ("paper_used_questions", pa.int64()),  # of those, how many the paper's experiments asked (CharadesEgo)
        ("paper_yes_to_no", pa.string()),
        ("paper_yes_share", pa.float64()),
        # CharadesEgo ego sets: the share of their frames (images) at the middle of the egocentric row's own
        # interval of the action, and at the exo time scaled by the length ratio (data.charades.frame_table)
        ("ego_own_interval_share", pa.float64()),
        ("ego_scaled_exo_share", pa.float64()),
    ]
)


# One row per (question, decoder layer) of the attention analysis (analysis/attention.py).
ATTENTION = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("question_id", pa.string()),
        ("layer", pa.int64()),
        ("visual_share", pa.float64()),
        ("verb_share", pa.float64()),
        ("object_share", pa.float64()),
        ("key_area_share", pa.float64()),
        ("key_area_raw", pa.float64()),
        ("key_area_lift", pa.float64()),
        ("image_id", pa.string()),
        ("answer", pa.string()),
        ("correct", pa.bool_()),
    ]
)


# Nullu's truthful/hallucinated pairs (derived/nullu.py), saved beside the edited weights: images relative to the
# data root (HICO: images/train2015/...); HOI ids 0-based, -1 for LURE-format pairs.
NULLU_PAIRS = pa.schema(
    [
        ("image", pa.string()),
        ("truthful_prompt", pa.string()),
        ("hallucinated_prompt", pa.string()),
        ("truthful", pa.string()),
        ("hallucinated", pa.string()),
        ("hoi_id", pa.int64()),
        ("negative_hoi_id", pa.int64()),
    ]
)


# Attention summary (analysis/attention_summary.py): per (qset, condition, model, layer, measure, group),
# the correct and hallucinated rows compared (means, medians, difference with an image-bootstrap CI, AUROC).
ATTENTION_SUMMARY = pa.schema(
    [
        ("dataset", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("layer", pa.int64()),
        ("measure", pa.string()),
        ("group", pa.string()),
        ("statistic", pa.string()),
        ("value", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("n", pa.int64()),
    ]
)


# Object reliance (analysis/object_reliance.py): one row per (model, object, yn|mc), Fig. 15 and Table 6 ...
OBJECT_RELIANCE = pa.schema(
    [
        ("model", pa.string()),
        ("object", pa.string()),
        ("qset_pair", pa.string()),
        ("n_obj", pa.int64()),
        ("n_verb", pa.int64()),
        ("acc_obj", pa.float64()),
        ("acc_verb", pa.float64()),
        ("delta", pa.float64()),
        ("in_set", pa.bool_()),
    ]
)


# ... and one row per (model, verb), Table 7.
VERB_INFLUENCE = pa.schema(
    [
        ("model", pa.string()),
        ("verb", pa.string()),
        ("n_obj", pa.int64()),
        ("n_verb", pa.int64()),
        ("yes_obj", pa.float64()),
        ("yes_verb", pa.float64()),
        ("delta", pa.float64()),
        ("influenced", pa.bool_()),
    ]
)


# Paper Tables 6 and 7 (percent): our rows ("measured", with the set sizes) and the paper's ("paper").
RELIANCE_TABLE6 = pa.schema(
    [
        ("source", pa.string()),
        ("model", pa.string()),
        ("variant", pa.string()),
        ("overlap_index", pa.float64()),
        ("s1", pa.int64()),
        ("s2", pa.int64()),
        ("s1_and_s2", pa.int64()),
    ]
)


RELIANCE_TABLE7 = pa.schema(
    [
        ("source", pa.string()),
        ("model_a", pa.string()),
        ("model_b", pa.string()),
        ("variant", pa.string()),
        ("iou", pa.float64()),
        ("w_a", pa.int64()),
        ("w_b", pa.int64()),
        ("w_a_and_w_b", pa.int64()),
        ("w_a_or_w_b", pa.int64()),
    ]
)


def _paper_table(keys: tuple[str, ...], labels: tuple[str, ...]) -> pa.Schema:
    """A paper table beside ours (tables.py): identifying columns, one value per label and its 95% interval, and
    ``note``: why a row of ours has no value (``tables.NO_VALUES``, ``tables.NOT_RUN``; else null)."""
    return pa.schema(
        [("source", pa.string()), *[(key, pa.string()) for key in keys], ("model", pa.string()),
         ("variant", pa.string()), ("paper_name", pa.string()), *[(label, pa.float64()) for label in labels],
         *[(f"{label}_{end}", pa.float64()) for label in labels for end in ("ci_low", "ci_high")],
         ("note", pa.string())]
    )


# Paper Table 5 (mitigation_tables.py; percent): per group (Table 5's methods, Appendix F's prompt suffix) and
# method (the paper's row name), our rows ("measured") and the paper's ("paper"); paper_name = the paper model
# a row is compared with.
MITIGATION_TABLE5 = _paper_table(
    ("group", "method"), ("yn_obj_acc", "yn_obj_f1", "yn_verb_acc", "yn_verb_f1", "mc_obj_acc", "mc_verb_acc")
)


# Paper Table 8 (mitigation_tables.py; percent): per decoding (the variant's paper_name), as Table 1's columns.
DECODING_TABLE8 = _paper_table(
    ("decoding",), ("yn_obj_acc", "yn_obj_prec", "yn_obj_recall", "yn_verb_acc", "yn_verb_prec", "yn_verb_recall",
                    "mc_obj_acc", "mc_verb_acc", "yn_obj_unknown", "yn_verb_unknown", "mc_obj_unknown",
                    "mc_verb_unknown")
)


# Token uncertainty (analysis/uncertainty.py, Figs. 9 and 12): one row per histogram bin of one
# (model, variant, condition, qset, group, correct) series; group is pred_yes, pred_no or mc.
UNCERTAINTY_HIST = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("condition", pa.string()),
        ("qset", pa.string()),
        ("group", pa.string()),
        ("correct", pa.bool_()),
        ("bin_left", pa.float64()),
        ("bin_right", pa.float64()),
        ("count", pa.int64()),
        ("density", pa.float64()),
    ]
)


# Field of view (analysis/fov.py, Fig. 10): one row per (model, variant, qset, condition) on the questions
# every FOV condition shares; delta_* is the paired change against the first (reference) condition.
FOV = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("margin", pa.float64()),
        ("crop_area_frac_mean", pa.float64()),
        ("n", pa.int64()),
        ("n_groups", pa.int64()),
        ("acc_plain", pa.float64()),
        ("acc_circular", pa.float64()),
        ("conf_mean", pa.float64()),
        ("conf_mean_correct", pa.float64()),
        ("conf_mean_hallucinated", pa.float64()),
        ("delta_conf_mean", pa.float64()),
        ("delta_ci_low", pa.float64()),
        ("delta_ci_high", pa.float64()),
    ]
)


# The question rows behind FOV (what Fig. 10's boxes are drawn from); confidence is null where it is not
# a token probability (baselines) or the row has an error.
FOV_ROWS = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("qset", pa.string()),
        ("condition", pa.string()),
        ("question_id", pa.string()),
        ("image_id", pa.string()),
        ("group_id", pa.string()),
        ("correct", pa.bool_()),
        ("confidence", pa.float64()),
    ]
)


# One row per (condition, model, variant, asked HOI) of the Known-Object AP (analysis/known_object.py).
KNOWN_OBJECT_AP = pa.schema(
    [
        ("dataset", pa.string()),
        ("condition", pa.string()),
        ("model", pa.string()),
        ("variant", pa.string()),
        ("hoi_id", pa.int64()),
        ("verb", pa.string()),
        ("object", pa.string()),
        ("rare", pa.bool_()),
        ("n_pos", pa.int64()),
        ("n", pa.int64()),
        ("ap", pa.float64()),
        ("ap_voc11", pa.float64()),
        ("n_tied_scores", pa.int64()),
    ]
)


# VCD divergence (analysis/vcd_divergence.py): one row per (model, VCD variant, condition, qset), plus the
# sets pooled ("a+b"); KL columns over the rows with a stored vcd_kl, flip columns against the plain
# counterpart (null, with plain_note saying why, when there is none); paper_* on the pooled row only.
VCD_DIVERGENCE = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("condition", pa.string()),
        ("qset", pa.string()),
        ("plain_variant", pa.string()),
        ("plain_note", pa.string()),
        ("beta", pa.float64()),  # the run's plausibility cut (VCD's beta): it sets how often the KL is exactly 0
        ("n", pa.int64()),
        ("n_dropped", pa.int64()),
        ("n_kl_zero", pa.int64()),
        ("share_kl_zero", pa.float64()),
        ("n_plausible_one", pa.int64()),
        ("share_plausible_one", pa.float64()),
        ("n_kl_zero_plausible_many", pa.int64()),
        ("plausible_mean", pa.float64()),
        ("kl_mean", pa.float64()),
        ("kl_median", pa.float64()),
        ("kl_q90", pa.float64()),
        ("kl_q99", pa.float64()),
        ("kl_max", pa.float64()),
        ("kl_median_positive", pa.float64()),
        # the same of the other direction, KL(p~ || q) (vcd_kl_reverse); null for tables written without it
        ("kl_reverse_mean", pa.float64()),
        ("kl_reverse_median", pa.float64()),
        ("kl_reverse_q90", pa.float64()),
        ("kl_reverse_q99", pa.float64()),
        ("kl_reverse_max", pa.float64()),
        ("n_paired", pa.int64()),
        ("n_flips", pa.int64()),
        ("flip_share", pa.float64()),
        ("yes_to_no", pa.int64()),
        ("no_to_yes", pa.int64()),
        ("n_fixed", pa.int64()),
        ("n_broken", pa.int64()),
        ("n_flips_plausible_one", pa.int64()),
        ("paper_model", pa.string()),
        ("paper_model_match", pa.bool_()),
        ("paper_n", pa.int64()),
        ("paper_share_kl_zero", pa.float64()),
    ]
)


# Its KL histogram: per series an exact-zero bin (bin_left == bin_right == 0), then log-spaced bins shared by
# every series; share = count / the series' KL rows (all shares of a series add up to 1).
VCD_KL_HIST = pa.schema(
    [
        ("model", pa.string()),
        ("variant", pa.string()),
        ("condition", pa.string()),
        ("qset", pa.string()),
        ("bin_left", pa.float64()),
        ("bin_right", pa.float64()),
        ("count", pa.int64()),
        ("share", pa.float64()),
    ]
)


# A LoRA fine-tune's log (derived/finetune.py): one row per optimizer step (1-based); loss = mean cross-entropy
# over the step's answer tokens, lr = the learning rate the step used, tokens = its answer (loss) tokens.
TRAIN_LOG = pa.schema(
    [
        ("step", pa.int64()),
        ("loss", pa.float64()),
        ("lr", pa.float64()),
        ("tokens", pa.int64()),
    ]
)


# Pangea training questions per source (derived/pangea.py): the pattern that left it out (empty: kept), its
# samples, labels and unsafe image names, the images and questions drawn, the selected (290) nodes they reach.
PANGEA_SOURCES = pa.schema(
    [
        ("source", pa.string()),
        ("excluded_by", pa.string()),
        ("samples", pa.int64()),
        ("unsafe_names", pa.int64()),
        ("labels", pa.int64()),
        ("images", pa.int64()),
        ("mc_questions", pa.int64()),
        ("yn_yes", pa.int64()),
        ("yn_no", pa.int64()),
        ("nodes_covered", pa.int64()),
    ]
)
