"""One inference job per image shard across all question sets.

The suite job must give the rows the per-set jobs gave (tiny LLaVA and a baseline), compute each image's
prefix once for YN and MC, keep per-set answers for reuse, and keep the shard guarantees.
"""

from __future__ import annotations

import logging
import math
import zlib

import numpy as np
import pandas as pd
import pytest

from verbmirage.benchmark.conditions import ImageResolver, apply_condition
from verbmirage.inference.runs import (
    RunSpec,
    IncompleteShardError,
    image_shard,
    predict_suite,
    run_shard,
    run_suite,
    select_suite_shard,
    suite_calls,
    suite_order,
    suite_table,
)
from verbmirage.inference.shards import merge_suite_shards
from verbmirage.inference.store import ShardBusyError, PartStore, parts_directory
from verbmirage.models.base import score_questions
from verbmirage.core.io import read_provenance, read_table, write_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PREDICTIONS
from verbmirage.models import Question, create_model
from verbmirage.models.base import MultipleChoiceResult, VisionLanguageModel, YesNoResult
from verbmirage.benchmark.questions import QuestionSettings, build_question_set
from verbmirage.models.tiny import build_tiny_llava
from verbmirage.variants.settings import Variant, VCDSettings

SETS = ("yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist")
FLOATS = ("p_yes", "yes_margin", "confidence")


@pytest.fixture(scope="module")
def suite(demo_anno, demo_roots, tmp_path_factory):
    """The demo's five HICO sets (MC rotations included) on its first six images, with a clean condition."""
    base = tmp_path_factory.mktemp("suite")
    tables = {qset: build_question_set(demo_anno, qset, QuestionSettings()) for qset in SETS}
    images = sorted(set().union(*(set(t.image) for t in tables.values())))[:6]
    paths = {}
    for qset, table in tables.items():
        paths[qset] = base / f"{qset}.parquet"
        write_table(table[table.image.isin(images)].reset_index(drop=True), paths[qset], QUESTIONS)
    apply_condition(demo_roots[0], images, base / "clean", "clean", {"type": "clean"})
    return base, paths


@pytest.fixture(scope="module")
def tiny_llava_entry(tmp_path_factory):
    path = build_tiny_llava(tmp_path_factory.mktemp("llava") / "tiny_llava")
    return {"backend": "llava", "path": str(path), "local_files_only": True}


def _assert_same_rows(ours: pd.DataFrame, theirs: pd.DataFrame) -> None:
    """Identical decisions and texts; scores equal up to float32 batching noise (batches hold other rows)."""
    ours, theirs = (t.sort_values("question_id").reset_index(drop=True) for t in (ours, theirs))
    exact = ["question_id", "raw_answer", "prediction", "parse_rule", "error"]
    pd.testing.assert_frame_equal(ours[exact], theirs[exact])
    for column in FLOATS:
        np.testing.assert_allclose(ours[column].astype(float), theirs[column].astype(float), atol=1e-5)
    for a, b in zip(ours.option_probs, theirs.option_probs):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("model", ["random", "tiny_llava"])
def test_suite_rows_equal_the_per_set_jobs(suite, tiny_llava_entry, tmp_path, model):
    base, paths = suite
    entry = tiny_llava_entry if model == "tiny_llava" else {"backend": "random", "seed": 0}
    counts = run_suite(paths, tmp_path / "suite", RunSpec(model, entry, base / "clean", batch_size=8))
    assert counts == {qset: len(read_table(path)) for qset, path in paths.items()}
    for qset, path in paths.items():
        per_set = run_shard(path, tmp_path / f"{qset}.parquet", RunSpec(model, entry, base / "clean", batch_size=8))
        ours = read_table(suite_table(tmp_path / "suite", qset), PREDICTIONS)
        _assert_same_rows(ours, per_set)
        assert read_provenance(suite_table(tmp_path / "suite", qset))["qset"] == qset
    # two shards, merged per set, give the same rows again
    for shard in (0, 1):
        run_suite(paths, tmp_path / f"two/{shard}", RunSpec(model, entry, base / "clean", {}, shard, 2, batch_size=8))
    for qset, path in paths.items():
        merged = merge_suite_shards(read_table(path, QUESTIONS), [tmp_path / "two/0", tmp_path / "two/1"], qset)
        assert merged.question_id.tolist() == read_table(path).question_id.tolist()  # question order
        _assert_same_rows(merged, read_table(tmp_path / f"{qset}.parquet", PREDICTIONS))


def test_mixed_kinds_compute_each_image_prefix_once(suite, tiny_llava_entry):
    base, paths = suite
    model = create_model("tiny_llava", tiny_llava_entry)
    model.continue_tokens = 0  # the scoring pass only
    questions = suite_order(pd.concat([read_table(p, QUESTIONS) for p in paths.values()], ignore_index=True))
    asked = [Question(r.question_id, r.prompt, base / "clean" / r.image, tuple(r.options) if r.options is not None
                      else ()) for r in questions.itertuples()]
    flags = [qset.startswith("mc") for qset in questions.qset]
    calls = []
    hook = model.model.model.vision_tower.register_forward_hook(lambda *args: calls.append(1))
    try:
        mixed = []
        for start in range(0, len(asked), 16):  # batches cut across images and kinds
            mixed += score_questions(model, asked[start : start + 16], flags[start : start + 16])
    finally:
        hook.remove()
    assert len(calls) == questions.image.nunique()  # once per image for all five sets
    yn = [q for q, f in zip(asked, flags) if not f]
    alone = dict(zip([q.question_id for q in yn], model.score_yes_no(yn)))
    for question, flag, result in zip(asked, flags, mixed):
        if not flag:
            assert result.p_yes == pytest.approx(alone[question.question_id].p_yes, abs=1e-5)
            assert result.prediction == alone[question.question_id].prediction
        else:
            assert len(result.option_probs) == len(question.options) and sum(result.option_probs) == pytest.approx(1)


def test_image_shards_do_not_move_when_a_set_is_added(suite):
    _, paths = suite
    one = read_table(paths["yn_obj"], QUESTIONS)
    both = pd.concat([one, read_table(paths["mc_verb"], QUESTIONS)], ignore_index=True)
    for shard in range(3):
        before = set(select_suite_shard(one, shard, 3).image)
        after = set(select_suite_shard(both, shard, 3).image)
        assert before <= after and all(image_shard(image, 3) == shard for image in after)
    with pytest.raises(ValueError, match="shard 3"):
        select_suite_shard(one, 3, 3)


def test_adding_a_set_asks_only_its_questions(suite, tmp_path, caplog):
    base, paths = suite
    entry = {"backend": "random", "seed": 0}
    output = tmp_path / "0"
    run_suite({"yn_obj": paths["yn_obj"]}, output, RunSpec("random", entry, base / "clean"))
    parts = parts_directory(output)
    assert [p.name for p in (parts / "yn_obj").glob("part-*")] == ["part-000000.parquet"]  # kept, one hard link
    assert (parts / "yn_obj/part-000000.parquet").stat().st_ino == suite_table(output, "yn_obj").stat().st_ino
    first = read_table(suite_table(output, "yn_obj"), PREDICTIONS)
    suite_table(output, "yn_obj").unlink()  # Snakemake removes a job's output before it reruns
    with caplog.at_level(logging.INFO, logger="verbmirage.inference.runs"):
        counts = run_suite({"yn_obj": paths["yn_obj"], "mc_obj": paths["mc_obj"]}, output, RunSpec("random", entry, base / "clean"))
    n = len(read_table(paths["yn_obj"]))
    assert f"yn_obj: resuming: {n} of {n} questions already answered" in caplog.text
    assert "mc_obj: resuming" not in caplog.text
    assert counts == {"yn_obj": n, "mc_obj": len(read_table(paths["mc_obj"]))}
    pd.testing.assert_frame_equal(read_table(suite_table(output, "yn_obj"), PREDICTIONS), first)
    # other settings: nothing is reused
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="verbmirage.inference.runs"):
        run_suite({"yn_obj": paths["yn_obj"]}, output, RunSpec("random", {**entry, "seed": 1}, base / "clean"))
    assert "resuming" not in caplog.text


def test_a_second_writer_fails_before_loading_a_model(suite, tmp_path):
    base, paths = suite
    output = tmp_path / "0"
    holder = PartStore(parts_directory(output) / "mc_obj")
    with pytest.raises(ShardBusyError, match="mc_obj"):
        run_suite(paths, output, RunSpec("random", {"backend": "random", "seed": 0}, base / "clean"))
    holder.close()
    assert not output.exists()
    run_suite(paths, output, RunSpec("random", {"backend": "random", "seed": 0}, base / "clean"))
    assert sorted(p.name for p in output.iterdir()) == sorted(f"{qset}.parquet" for qset in SETS)


def test_a_job_holds_at_most_a_part_and_a_call_of_rows_per_set(suite, tmp_path, monkeypatch):
    """Memory does not grow with the questions. Answered rows go to parts as they come (at most
    a part plus one call's rows wait per set), and each set's table is written from its parts one at a time
    (row groups of ``part_size`` rows), never gathered into one frame."""
    import pyarrow.parquet as pq

    base, paths = suite
    held = []  # (set, rows) of each part written
    append = PartStore.append
    monkeypatch.setattr(PartStore, "append",
                        lambda store, rows: (held.append((store.directory.name, len(rows))), append(store, rows))[1])
    part_size, batch_size = 16, 8
    counts = run_suite(paths, tmp_path / "0", RunSpec("random", {"backend": "random", "seed": 0}, base / "clean", batch_size=batch_size, part_size=part_size))
    assert sum(n for _, n in held) == sum(counts.values()) and max(n for _, n in held) < part_size + batch_size
    for qset, n in counts.items():
        parts = [rows for name, rows in held if name == qset]
        assert sum(parts) == n and len(parts) > 1  # every set spans several parts here
        table = pq.ParquetFile(suite_table(tmp_path / "0", qset))  # row groups of part_size rows, the last shorter
        assert table.metadata.num_rows == n and table.metadata.num_row_groups == -(-n // part_size)
        assert [table.metadata.row_group(i).num_rows for i in range(table.metadata.num_row_groups - 1)] == \
            [part_size] * (table.metadata.num_row_groups - 1)


class _PrefixKeeping(VisionLanguageModel):
    """Scores that depend on the call as the transformers engine's do: the prefixes of a call's new images are
    computed as one batch (their floats depend on the batch), kept while the next call asks the same image, and
    every answer on an image depends on its prefix. Stops (as Ctrl-C would) after ``stop_after`` calls."""

    backend = "prefix_keeping"

    def __init__(self, stop_after: int | None = None):
        super().__init__("prefix_keeping")
        self.stop_after, self.calls, self.images, self.prefixes = stop_after, [], [], {}

    def _scores(self, questions) -> list[float]:
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            raise KeyboardInterrupt
        self.calls.append([q.question_id for q in questions])
        images = sorted({str(q.image) for q in questions})
        self.images.append(images)
        self.prefixes = {image: value for image, value in self.prefixes.items() if image in images}
        new = [image for image in images if image not in self.prefixes]
        self.prefixes.update(dict.fromkeys(new, zlib.crc32(",".join(new).encode())))
        return [((self.prefixes[str(q.image)] + zlib.crc32(q.question_id.encode())) % 997) / 997 for q in questions]

    mixed_kinds = True  # YN and MC of a call in one pass, as the transformers engine

    def score_mixed(self, questions, multiple_choice):
        return [MultipleChoiceResult((p, 1 - p) + (0.0,) * (len(q.options) - 2), "A", "A", p, "test") if mc
                else YesNoResult(p, "yes" if p >= 0.5 else "no", "x", p, "test")
                for p, q, mc in zip(self._scores(questions), questions, multiple_choice)]

    def _score_yes_no(self, questions):
        return self.score_mixed(questions, [False] * len(questions))

    def _score_multiple_choice(self, questions):
        return self.score_mixed(questions, [True] * len(questions))


def _suite_questions(paths) -> pd.DataFrame:
    return pd.concat([read_table(paths[qset], QUESTIONS) for qset in ("yn_obj", "mc_obj")], ignore_index=True)


def test_calls_hold_whole_images_and_an_image_never_shares_two_calls(suite):
    _, paths = suite
    images = suite_order(_suite_questions(paths)).image.tolist()
    for per_call in (1, 5, 16, 64, 10_000):
        calls = suite_calls(images, per_call)
        assert [row for call in calls for row in call] == list(range(len(images)))
        assert all(len(call) <= per_call for call in calls)
        for image in set(images):
            holding = [call for call in calls if image in {images[i] for i in call}]
            if len(holding) > 1:  # split only where the image alone is larger than a call, then alone
                assert images.count(image) > per_call
                assert all({images[i] for i in call} == {image} for call in holding)


def test_a_job_resumed_after_any_call_answers_bit_identically(suite, tmp_path):
    """Rows are stored only after their call, and calls are cut over every question of the shard with whole
    images: the rows asked after an interruption meet the same call-mates and image prefixes as in an
    uninterrupted run, so their answers are bit-identical wherever the job stopped."""
    base, paths = suite
    questions, resolver = _suite_questions(paths), ImageResolver(base / "clean")
    sets = ("yn_obj", "mc_obj")

    def run(root, model):
        stores = {qset: PartStore(root / qset, "f") for qset in sets}
        try:
            predict_suite(questions, model, resolver, stores, batch_size=24, part_size=4, max_error_share=1.0)
        finally:
            for store in stores.values():
                store.close()
        return {qset: PartStore(root / qset, "f").rows().sort_values("question_id", ignore_index=True)
                for qset in sets}

    reference = _PrefixKeeping()
    expected = run(tmp_path / "reference", reference)
    assert max(map(len, reference.images)) > 1  # prefixes of several images computed together
    for stop_after in range(1, len(reference.calls)):
        root = tmp_path / f"stopped-{stop_after}"
        with pytest.raises(KeyboardInterrupt):
            run(root, _PrefixKeeping(stop_after))
        resumed = _PrefixKeeping()
        answers = run(root, resumed)
        assert resumed.calls == reference.calls[stop_after:], stop_after
        for qset in sets:
            pd.testing.assert_frame_equal(answers[qset], expected[qset], check_exact=True, obj=f"{qset} {stop_after}")


def test_non_finite_scores_of_the_engine_are_error_rows_and_fail_the_job(suite, tiny_llava_entry, tmp_path):
    """VCD with alpha = inf made a job exit 0 with every answer "unknown",
    no error row and P(yes) NaN. Planning and ``Variant.from_config`` now refuse the setting; set here directly
    (as NaN logits from an fp16 overflow would arrive), every YN and MC answer is an error row that names the
    model, the question and the image, and the error budget fails the job."""
    base, paths = suite
    questions, resolver = _suite_questions(paths), ImageResolver(base / "clean")
    model = create_model("tiny_llava", tiny_llava_entry)

    def run(root, variant, max_error_share):
        model.use_variant(variant)
        stores = {qset: PartStore(root / qset, "f") for qset in ("yn_obj", "mc_obj")}
        try:
            predict_suite(questions, model, resolver, stores, batch_size=64, part_size=512,
                          max_error_share=max_error_share)
        finally:
            for store in stores.values():
                store.close()
        return pd.concat([PartStore(root / qset, "f").rows() for qset in stores], ignore_index=True)

    broken = Variant(decoding="beam", num_beams=2, max_new_tokens=2, vcd=VCDSettings(alpha=math.inf))  # vcd_beam
    with pytest.raises(IncompleteShardError, match=r"more than max_error_share=0.05; first error: models.tiny_llava: "
                                                   r"question \w+ on image \S+\.jpg: non-finite score, confidence = nan"):
        run(tmp_path / "budget", broken, 0.05)
    rows = run(tmp_path / "all", broken, 1.0).merge(questions[["question_id", "image", "qset"]], on="question_id")
    assert len(rows) == len(questions) and rows.parse_rule.eq("error").all() and rows.prediction.eq("unknown").all()
    for row in rows.itertuples():
        assert f"question {row.question_id} on image " in row.error and row.error.split(": ")[1].endswith(row.image)
    # an undefined score is no error: a cut that keeps only the top token leaves most YN answers no yes or no mass
    rows = run(tmp_path / "cut", Variant(decoding="beam", num_beams=2, max_new_tokens=2, vcd=VCDSettings(beta=1.0)),
               0.05)
    yes_no = rows[rows.option_probs.isna()]
    assert rows.error.isna().all() and yes_no.p_yes.isna().any() and yes_no.confidence.notna().all()


def test_a_sampled_model_answers_the_same_fixed_sample_in_any_shard_and_is_scored_on_it(suite, tmp_path):
    """models.<slug>.sample_questions: N groups per set (MC rotations together), the same whatever the shards,
    recorded in the provenance; the merge expects them and the metrics count only them."""
    from verbmirage.evaluation.metrics import BootstrapSettings, evaluate_run
    from verbmirage.benchmark.question_table import question_sample

    base, paths = suite
    entry = {"backend": "random", "seed": 0, "sample_questions": 3, "sample_seed": 1}
    for n_shards in (1, 2):
        for shard in range(n_shards):
            run_suite(paths, tmp_path / f"{n_shards}/{shard}", RunSpec("random", entry, base / "clean", {}, shard, n_shards))
    for qset in SETS:
        questions = read_table(paths[qset], QUESTIONS)
        one = read_table(suite_table(tmp_path / "1/0", qset), PREDICTIONS)
        two = merge_suite_shards(question_sample(questions, 3, 1), [tmp_path / "2/0", tmp_path / "2/1"], qset)
        assert set(one.question_id) == set(two.question_id) == set(question_sample(questions, 3, 1).question_id)
        groups = questions[questions.question_id.isin(one.question_id)].group_id
        assert groups.nunique() == min(3, questions.group_id.nunique())
        assert len(one) == questions[questions.group_id.isin(set(groups))].shape[0]  # rotations kept whole
        assert read_provenance(suite_table(tmp_path / "1/0", qset))["model"]["sample_questions"] == 3
        path = tmp_path / f"{qset}.parquet"
        write_table(two, path, PREDICTIONS, provenance=read_provenance(suite_table(tmp_path / "1/0", qset)))
        rows = evaluate_run([(qset, paths[qset], path)], {"dataset": "hico", "condition": "clean", "model": "random",
                                                          "variant": "default"}, BootstrapSettings(resamples=0))
        counted = rows[(rows.subset == "all") & rows.metric.isin(["accuracy", "circular_accuracy"])].n.max()
        assert counted == groups.nunique() if qset.startswith("mc") else counted == len(one)
    assert question_sample(read_table(paths["yn_obj"], QUESTIONS), 3, 2).question_id.tolist() != \
        question_sample(read_table(paths["yn_obj"], QUESTIONS), 3, 1).question_id.tolist()


def test_greedy_vcd_decodes_mc_questions_that_share_a_text_header(suite, tiny_llava_entry):
    """Greedy VCD decodes the undecided answers on a clean and a noised stream; the MC prompts of an image share
    a text header (the stem before the options) that becomes part of their cached prefix. The noised rows must
    split where the clean ones do (it failed with mismatched prefix lengths), and a batch answers each question
    as it is answered alone."""
    base, paths = suite
    resolver = ImageResolver(base / "clean")
    table = read_table(paths["mc_obj"], QUESTIONS)
    questions = [Question(r.question_id, r.prompt, resolver.path(r.image), tuple(r.options))
                 for r in table.itertuples()]
    model = create_model("tiny_llava", tiny_llava_entry)
    model.use_variant(Variant.from_config({"vcd": {}}))
    model.continue_tokens = 3
    together = model.score_multiple_choice(questions)
    assert all(result.error is None for result in together)
    for question, result in list(zip(questions, together))[:8]:
        model.forget_prefixes()
        (alone,) = model.score_multiple_choice([question])
        assert (alone.prediction, alone.raw_answer, alone.parse_rule) == \
            (result.prediction, result.raw_answer, result.parse_rule)


def test_every_sets_parts_end_at_the_same_call(suite, tmp_path, monkeypatch):
    """A SIGKILL loses the rows no part holds yet. A call's answers can depend on its other rows (the engine's),
    so a resume must ask whole calls: whenever rows are stored, every set's pending rows are stored together and
    what the stores hold is the answers of the job's first calls, never part of a call."""
    base, paths = suite
    order = list(paths)
    stored, flushes = set(), []
    append = PartStore.append

    def recording(store, rows):
        name = store.directory.name
        if flushes and order.index(name) > order.index(flushes[-1][0]):
            flushes[-1] = (name, None)  # the same flush, a later set
        else:
            flushes.append((name, None))
        stored.update(row["question_id"] for row in rows)
        flushes[-1] = (name, set(stored))
        return append(store, rows)

    monkeypatch.setattr(PartStore, "append", recording)
    part_size, batch_size = 16, 8
    run_suite(paths, tmp_path / "0", RunSpec("random", {"backend": "random", "seed": 0}, base / "clean",
                                             batch_size=batch_size, part_size=part_size))
    questions = suite_order(pd.concat([read_table(path, QUESTIONS).assign(qset=qset) for qset, path in paths.items()],
                                      ignore_index=True))
    calls = suite_calls(questions.image.tolist(), batch_size)
    whole = [set(questions.question_id.iloc[: call.stop]) for call in calls]
    assert len(flushes) > 2  # parts were stored along the way, not only at the end
    for _, ids in flushes:
        assert ids in whole, "a part ended inside a call"
