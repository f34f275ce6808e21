"""Work a job does once that it used to repeat (a fast demo), with the results unchanged."""

import pytest

import verbmirage.benchmark.conditions as conditions
from verbmirage.benchmark.conditions import ImageResolver, apply_condition


def test_image_paths_are_checked_once_per_image(demo_roots, tmp_path, monkeypatch):
    """An image has many questions: its containment check (two resolves) runs at its first question only,
    the path is the same every time, and a missing image is an error every time it is asked for."""
    root = demo_roots[0]
    images = sorted(str(p.relative_to(root)) for p in (root / "images" / "test2015").glob("*.jpg"))[:3]
    images.append("images/test2015/HICO_test2015_99999999.jpg")  # missing on disk: an error row
    apply_condition(root, images, tmp_path / "clean", "clean", {"type": "clean"})
    checks = []
    real_inside = conditions.inside
    monkeypatch.setattr(conditions, "inside", lambda *args: checks.append(args[1]) or real_inside(*args))
    resolver = ImageResolver(tmp_path / "clean")
    first = [resolver.path(image) for image in images[:3]]
    assert [resolver.path(image) for image in images[:3] * 4] == first * 4
    assert all(path.is_symlink() and path.resolve().is_relative_to(root.resolve()) for path in first)
    assert len(checks) == 6  # clean links: the condition folder, then the source root, once per image
    for _ in range(2):
        with pytest.raises(FileNotFoundError, match="99999999"):
            resolver.path(images[3])


def test_one_attention_job_over_all_sets_equals_one_job_per_set(demo_roots, demo_anno, tiny_dirs, tmp_path,
                                                                  monkeypatch):
    """The attention job loads its model once for every set; its rows equal those of one job per set, and the
    collected table keeps the order of the per-set jobs (set by set, then condition and model)."""
    import pandas as pd

    from verbmirage.analysis import attention
    from verbmirage.analysis.attention import attention_job, collect_attention
    from verbmirage.core.io import write_table
    from verbmirage.benchmark.question_table import QUESTIONS
    from verbmirage.core.schemas import ATTENTION
    from verbmirage.benchmark.questions import QuestionSettings, build_question_sets

    root, det_root = demo_roots
    qsets = ["yn_obj", "mc_verb"]
    tables = build_question_sets(demo_anno, qsets, QuestionSettings())
    paths = {}
    for qset, table in tables.items():
        paths[qset] = tmp_path / f"{qset}.parquet"
        write_table(table, paths[qset], QUESTIONS)
    images = sorted(set().union(*(set(table.image) for table in tables.values())))
    apply_condition(root, images, tmp_path / "clean", "clean", {"type": "clean"})
    loads = []
    real_create = attention.create_model
    monkeypatch.setattr(attention, "create_model", lambda *args: loads.append(args[0]) or real_create(*args))
    settings = {"layers": [-1], "sample": 3, "seed": 0, "batch_size": 4}
    entry = {"backend": "llava", "path": str(tiny_dirs["llava"]), "local_files_only": True}
    both = attention_job([paths[q] for q in qsets], tmp_path / "clean", det_root, "tiny", entry, settings, "clean",
                         tmp_path / "both.parquet")
    assert loads == ["tiny"]
    alone = [attention_job(paths[q], tmp_path / "clean", det_root, "tiny", entry, settings, "clean",
                           tmp_path / f"alone_{q}.parquet") for q in qsets]
    assert list(both.qset.unique()) == qsets and len(both) == 6
    pd.testing.assert_frame_equal(both.reset_index(drop=True), pd.concat(alone, ignore_index=True))
    # two (condition, model) jobs collected set by set: the order one job per (set, condition, model) gave
    other = both.assign(model="other")
    write_table(other, tmp_path / "other.parquet", ATTENTION)
    collected = collect_attention([tmp_path / "both.parquet", tmp_path / "other.parquet"], tmp_path / "all.parquet",
                                  qsets=qsets)
    expected = pd.concat([alone[0], alone[0].assign(model="other"), alone[1], alone[1].assign(model="other")],
                         ignore_index=True)
    assert collected[["qset", "model", "question_id"]].values.tolist() == (
        expected[["qset", "model", "question_id"]].values.tolist())
