"""Pangea loader (restricted unpickler, the real format), training questions and the leakage check."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from verbmirage.benchmark.pangea_training import (
    DEMO_NODE_INDEX,
    DEMO_NODES,
    DEMO_SOURCES,
    QSET_MC,
    QSET_YN,
    LeakageError,
    allocate,
    build_training_questions,
    check_no_test_images,
    hico_test_images,
    image_files,
    normalise_label,
    write_demo_pangea,
    write_training_questions,
)
from verbmirage.benchmark.pangea_settings import TrainingQuestionSettings
from verbmirage.data.pangea import PangeaFiles, PangeaFormatError, UnsafePickleError, load_pangea, load_plain_pickle
from verbmirage.core.io import read_table
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.core.schemas import PANGEA_SOURCES


class _RunsCode:
    """Unpickling this calls os.system: what a malicious pickle does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _Custom:
    pass


@pytest.fixture(scope="module")
def pangea_root(tmp_path_factory) -> Path:
    return write_demo_pangea(tmp_path_factory.mktemp("pangea") / "Data")


@pytest.fixture(scope="module")
def pangea(pangea_root):
    return load_pangea(pangea_root)


def test_a_pickle_that_runs_code_is_refused_naming_the_file(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "B123_train_KIN-FULL_with_node.pkl"
    path.write_bytes(pickle.dumps([("HAA", "a.png", ["x"], ["n"]), _RunsCode(marker)]))
    with pytest.raises(UnsafePickleError, match=r"B123_train_KIN-FULL_with_node\.pkl.*(posix|os|nt)\.system"):
        load_plain_pickle(path)
    assert not marker.exists()
    custom = tmp_path / "custom.pkl"
    custom.write_bytes(pickle.dumps({"objects": _Custom()}))
    with pytest.raises(UnsafePickleError, match="custom.pkl"):
        load_plain_pickle(custom)
    with pytest.raises(UnsafePickleError, match="not a readable pickle"):
        (tmp_path / "broken.pkl").write_bytes(b"\x80\x04garbage")
        load_plain_pickle(tmp_path / "broken.pkl")


class _HugeArray:
    """Unpickles as numpy's own array constructor asked for 2**62 bytes: only allowed globals, no code run."""

    def __reduce__(self):
        return np.ndarray.__reduce__(np.zeros(1, "b"))[0], (np.ndarray, (2**62,), b"b")


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickle_asking_for_a_huge_array_is_named(tmp_path, protocol):
    path = tmp_path / "B123_train_KIN-FULL_with_node.pkl"
    path.write_bytes(pickle.dumps([("HAA", "a.png", ["x"], _HugeArray())], protocol=protocol))
    with pytest.raises(UnsafePickleError, match=r"B123_train_KIN-FULL_with_node\.pkl: the pickle asks for more memory"):
        load_plain_pickle(path)


def test_a_malformed_label2node_file_is_named(tmp_path, pangea_root):
    root = tmp_path / "Data"
    shutil.copytree(pangea_root, root)
    (root / PangeaFiles().label2node).write_text('{"HAA//x": ["n1"')  # cut short
    with pytest.raises(PangeaFormatError, match=r"Label2Node_batch1\+2\+3\.json: not a readable JSON file"):
        load_pangea(root)


def test_plain_data_loads_in_every_protocol(tmp_path):
    data = [("HAA", "a.png", ("kayaking",), {"n1", "n2"}), {"k": [1, 2.5, None, True]}, np.array(["x", "y"])]
    for protocol in (0, 2, 4, 5):
        path = tmp_path / f"p{protocol}.pkl"
        path.write_bytes(pickle.dumps(data, protocol=protocol))
        loaded = load_plain_pickle(path)
        assert loaded[:2] == data[:2] and loaded[2].tolist() == ["x", "y"]


def test_demo_pangea_has_the_real_layout(pangea_root, pangea):
    files = PangeaFiles()
    raw = load_plain_pickle(pangea_root / files.samples)
    assert isinstance(raw, list) and all(isinstance(item, tuple) and len(item) == 4 for item in raw)
    assert set(load_plain_pickle(pangea_root / files.topology)) == {"Father2Son", "objects"}
    assert load_plain_pickle(pangea_root / files.node_index) == DEMO_NODE_INDEX
    assert len(pangea.samples) == 8 * len(DEMO_SOURCES) and set(pangea.samples.source) == set(DEMO_SOURCES)
    assert pangea.objects == DEMO_NODES and len(pangea.selected_nodes) == len(DEMO_NODE_INDEX)
    assert all((pangea_root / "Images" / name).is_file() for name in pangea.samples.image)
    assert any(len(labels) == 2 for labels in pangea.samples.labels)  # multi-label images
    assert {"Kinetics700", "HAKE", "HICO_DET"} <= set(pangea.samples.source)
    assert all(key.split("//")[0] in DEMO_SOURCES for key in pangea.label2node)


def test_label_fields_may_be_a_string_a_tuple_or_an_array(tmp_path, pangea_root):
    root = tmp_path / "Data"
    shutil.copytree(pangea_root, root)
    samples = [("HAA", "a.png", "kayaking", np.array(["run-51.3.2"])), ("HAA", "b.png", ("push_up",), "push-12")]
    (root / PangeaFiles().samples).write_bytes(pickle.dumps(samples))
    loaded = load_pangea(root).samples
    assert loaded.labels.tolist() == [["kayaking"], ["push_up"]]
    assert loaded.nodes.tolist() == [["run-51.3.2"], ["push-12"]]


@pytest.mark.parametrize("bad, message", [
    ([("HAA", "a.png", ["x"])], "item 0: expected a 4-tuple"),
    ([("HAA", "a.png", ["x"], ["n"]), ("HAA", 3, ["x"], ["n"])], "item 1: image_name"),
    ([("HAA", "a.png", [1], ["n"])], r"item 0 \(orig_action_labels\)"),
])
def test_a_malformed_sample_is_named(tmp_path, pangea_root, bad, message):
    root = tmp_path / "Data"
    shutil.copytree(pangea_root, root)
    (root / PangeaFiles().samples).write_bytes(pickle.dumps(bad))
    with pytest.raises(PangeaFormatError, match=message):
        load_pangea(root)


def test_node_index_out_of_range_is_refused(tmp_path, pangea_root):
    root = tmp_path / "Data"
    shutil.copytree(pangea_root, root)
    (root / PangeaFiles().node_index).write_bytes(pickle.dumps([0, 99]))
    with pytest.raises(PangeaFormatError, match=r"mapping_node_index.pkl: item 1 \(99\)"):
        load_pangea(root)


def test_allocate_is_proportional_and_moves_what_a_capped_source_cannot_take():
    assert allocate(10, {"a": 6, "b": 3, "c": 1}, {"a": 99, "b": 99, "c": 99}) == {"a": 6, "b": 3, "c": 1}
    assert allocate(10, {"a": 6, "b": 3, "c": 1}, {"a": 2, "b": 99, "c": 99}) == {"a": 2, "b": 6, "c": 2}
    assert allocate(7, {"a": 1, "b": 1}, {"a": 99, "b": 99}) in ({"a": 4, "b": 3}, {"a": 3, "b": 4})
    assert allocate(50, {"a": 1, "b": 1}, {"a": 3, "b": 4}) == {"a": 3, "b": 4}  # fewer than asked: all there is


def test_labels_are_normalised():
    assert normalise_label("unevenbar_cross") == "unevenbar cross"
    assert normalise_label("  Putting a  laptop_somewhere ") == "putting a laptop somewhere"


def test_training_questions_follow_the_protocol(pangea):
    settings = TrainingQuestionSettings(mc_questions=100, yn_questions=100, seed=3)
    built = build_training_questions(pangea, settings)
    questions = built.questions
    samples = pangea.samples.set_index("image")
    sources = samples.source.loc[questions.image]
    # Kinetics, HAKE (the paper's) and HICO-derived sources (ours) are left out
    assert set(sources) == {"HAA", "charades", "Home_Action_Genome"}
    labels_of = {image: {normalise_label(x) for x in labels} for image, labels in samples.labels.items()}
    source_labels = {s: set().union(*[labels_of[i] for i in g.index]) for s, g in samples.groupby("source")}
    mc = questions[questions.qset == QSET_MC]
    for row in mc.itertuples():
        options = list(row.options)
        correct = options["ABCD".index(row.answer)]
        wrong = [o for o in options if o != correct]
        assert len(options) == 4 and len(set(options)) == 4
        assert correct in labels_of[row.image] and correct == row.verb
        assert not set(wrong) & labels_of[row.image]
        assert set(options) <= source_labels[samples.source[row.image]]  # wrong labels of the same source
        assert row.prompt.splitlines()[0] == "Which of the following actions is present in the image?"
        assert row.prompt.splitlines()[1:] == [f"{letter}. {o}" for letter, o in zip("ABCD", options)]
        assert "_" not in row.prompt
    yn = questions[questions.qset == QSET_YN]
    assert (yn.answer == "yes").sum() == round(len(yn) / 3)  # 1:2, like the benchmark
    for row in yn.itertuples():
        assert row.prompt == f"Does this image show a person's activity: {row.verb}?"
        assert (row.verb in labels_of[row.image]) == (row.answer == "yes")
        assert row.verb in source_labels[samples.source[row.image]]
    assert questions.question_id.is_unique and (questions.group_id == questions.question_id).all()
    # images carrying an MC question have at least 3 wrong labels in their source
    assert all(len(source_labels[samples.source[i]] - labels_of[i]) >= 3 for i in mc.image)


def test_training_questions_are_seeded_and_sized(pangea):
    settings = TrainingQuestionSettings(mc_questions=12, yn_questions=20, negatives_per_positive=19, seed=1)
    first = build_training_questions(pangea, settings).questions
    again = build_training_questions(pangea, settings).questions
    pd.testing.assert_frame_equal(first, again)
    other = build_training_questions(pangea, TrainingQuestionSettings(mc_questions=12, yn_questions=20, seed=2))
    assert not first.question_id.equals(other.questions.question_id)
    assert (first.qset == QSET_MC).sum() == 12 and (first.qset == QSET_YN).sum() == 20
    assert (first[first.qset == QSET_YN].answer == "yes").sum() == 1  # round(20 / 20): the paper's 1:19
    # in proportion to the kept sources' samples (8 each): 12 MC -> 4 per source
    sources = pangea.samples.set_index("image").source.loc[first[first.qset == QSET_MC].image]
    assert sources.value_counts().tolist() == [4, 4, 4]


def test_exclusion_is_configurable(pangea):
    built = build_training_questions(pangea, TrainingQuestionSettings(mc_questions=200, yn_questions=200,
                                                                      exclude_sources=("kinetics*",)))
    sources = set(pangea.samples.set_index("image").source.loc[built.questions.image])
    assert "HICO_DET" in sources and "HAKE" in sources and "Kinetics700" not in sources
    table = built.sources.set_index("source")
    assert table.excluded_by["Kinetics700"] == "kinetics*" and table.excluded_by["HAKE"] == ""


def test_node_coverage_counts_the_selected_nodes_the_asked_images_reach(pangea):
    built = build_training_questions(pangea, TrainingQuestionSettings(mc_questions=200, yn_questions=200))
    selected = set(pangea.selected_nodes)
    nodes_of = dict(zip(pangea.samples.image, pangea.samples.nodes))
    reached = set().union(*[set(nodes_of[i]) for i in built.used_images]) & selected
    assert built.nodes_selected == len(DEMO_NODE_INDEX) == 8
    assert built.nodes_covered == len(reached) == 7  # the demo's kept sources never reach one selected node
    table = built.sources.set_index("source")
    assert table.loc[["HAKE", "HICO_DET", "Kinetics700"], "nodes_covered"].eq(0).all()
    assert table.images.sum() == len(built.used_images)
    assert table.mc_questions.sum() + table.yn_yes.sum() + table.yn_no.sum() == len(built.questions)


def test_written_tables_pass_the_schemas_and_value_checks(tmp_path, pangea_root, demo_roots):
    out = tmp_path / "out"
    settings = TrainingQuestionSettings(mc_questions=20, yn_questions=20)
    write_training_questions(pangea_root, PangeaFiles(), settings, demo_roots[0], out / "questions.parquet",
                             out / "sources.parquet", out / "summary.md")
    questions = read_table(out / "questions.parquet", QUESTIONS)  # check_questions: ids, answers, image paths
    assert len(questions) == 40 and set(questions.dataset) == {"pangea"}
    assert read_table(out / "sources.parquet", PANGEA_SOURCES).samples.sum() == 48
    summary = (out / "summary.md").read_text()
    assert "| selected nodes covered | 7 of 8 | 280 of 290 |" in summary and "| MC questions | 20 | 60,000 |" in summary


def test_a_planted_hico_test_image_fails_the_build(tmp_path, pangea_root, demo_roots):
    tests = hico_test_images(demo_roots[0])
    root = tmp_path / "Data"
    shutil.copytree(pangea_root, root)
    settings = TrainingQuestionSettings(mc_questions=200, yn_questions=200)
    data = load_pangea(root)
    used = build_training_questions(data, settings).used_images
    assert check_no_test_images(image_files(data, used), tests) == len(used)  # the clean demo passes
    # the same bytes under a kept source's name
    planted = next(name for name in used if name.startswith("charades_"))
    shutil.copyfile(tests[5], root / "Images" / planted)
    with pytest.raises(LeakageError, match=rf"{planted}.*byte for byte HICO test image .*{tests[5].name}"):
        write_training_questions(root, PangeaFiles(), settings, demo_roots[0], tmp_path / "q.parquet",
                                 tmp_path / "s.parquet", tmp_path / "s.md")
    assert not (tmp_path / "q.parquet").exists()
    # a test image's file name in a kept source (any extension, any folder)
    files = {f"haa/{tests[0].stem}.png": root / "Images" / used[0]}
    with pytest.raises(LeakageError, match=f"file name of HICO test image .*{tests[0].name}"):
        check_no_test_images(files, tests)


def test_config_check_names_a_missing_pangea(tmp_path):
    from verbmirage.workflow.config import DEMO_HICO_ROOT, check_config
    from verbmirage.core.errors import ConfigError

    models = {"base": {"backend": "llava", "path": "m"}, "tuned": {"derive": {"method": "lora_finetune", "base": "base"}}}
    config = {"datasets": {"hico": {"root": DEMO_HICO_ROOT}}, "models": models}
    with pytest.raises(ConfigError, match=r"models.tuned.derive: a fine-tune on Pangea .* needs datasets.pangea"):
        check_config(config, tmp_path)
    config["datasets"]["pangea"] = {"root": "nowhere", "samples": "B123_train_KIN-FULL_with_node.pkl"}
    with pytest.raises(ConfigError, match="datasets.pangea.root: 'nowhere' has no B123_train_KIN-FULL_with_node.pkl"):
        check_config(config, tmp_path)


def test_the_paper_configs_fine_tune_is_built_on_the_papers_mix(tmp_path):
    """configs/paper.yaml's "Pangea-LoRA (paper's method)" entry asks the paper's mix (Appendix D): Yes:No about
    1:19 and "present at the image" (sized down to a demo Pangea of 60 samples per source here)."""
    import yaml

    pangea = load_pangea(write_demo_pangea(tmp_path / "Data", samples_per_source=60))
    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/paper.yaml").read_text())
    entry = config["models"]["llava15_7b_pangea"]
    assert entry["paper_method"] == "Pangea-LoRA (paper's method)"
    settings = TrainingQuestionSettings.from_config({**entry["derive"]["pangea"], "mc_questions": 100,
                                                     "yn_questions": 160})
    assert settings.departures_from_paper() == ["100 MC + 160 YN questions, the paper's 60K + 60K"]
    questions = build_training_questions(pangea, settings).questions
    yn, mc = questions[questions.qset == QSET_YN], questions[questions.qset == QSET_MC]
    assert (yn.answer == "yes").mean() == pytest.approx(0.05, abs=0.005)
    assert all(prompt.splitlines()[0].endswith("present at the image?") for prompt in mc.prompt)
    assert TrainingQuestionSettings.from_config(entry["derive"]["pangea"]).departures_from_paper() == []
