"""Each config its own results tree (README, "Several configs in one checkout"; src/verbmirage/workflow/run_folders.py)."""

import json

import pytest

from verbmirage.workflow.paths import Paths
from verbmirage.workflow.run_folders import (
    ARTIFACT_FOLDERS,
    OWNER,
    RunFolderError,
    RunFolders,
    TreeOwnedError,
    claim,
    run_folders,
)


def test_the_demo_config_writes_to_results_and_any_other_file_to_its_own_tree(tmp_path):
    workflow, workdir = tmp_path / "repo", tmp_path / "work"
    (workflow / "configs").mkdir(parents=True)
    workdir.mkdir()
    demo = RunFolders("results", "logs", "benchmarks")
    assert run_folders("", [], workdir, workflow) == demo  # no --configfile: the Snakefile's config.yaml
    assert run_folders("", [workflow / "config.yaml"], workdir, workflow) == demo
    assert run_folders("", [workdir / "config.yaml"], workdir, workflow) == demo
    assert run_folders("", [workflow / "configs/paper.yaml"], workdir, workflow) == RunFolders(
        "results/paper", "logs/paper", "benchmarks/paper")
    assert run_folders("", [tmp_path / "elsewhere/config.yaml"], workdir, workflow).results == "results/config"
    assert run_folders("", [workflow / "configs/paper.yaml", workdir / "site.yml"], workdir, workflow).results == (
        "results/paper+site")


def test_results_dir_overrides_the_name(tmp_path):
    paper = [tmp_path / "paper.yaml"]
    assert run_folders("results/v2", paper, tmp_path, tmp_path) == RunFolders("results/v2", "logs/v2",
                                                                                "benchmarks/v2")
    assert run_folders("/scratch/vm", paper, tmp_path, tmp_path) == RunFolders(
        "/scratch/vm", "/scratch/vm/logs", "/scratch/vm/benchmarks")
    assert run_folders("results", paper, tmp_path, tmp_path) == RunFolders("results", "logs", "benchmarks")
    for bad in ("../other", "."):
        with pytest.raises(RunFolderError, match=r"results_dir: '\.\.?(/other)?'"):
            run_folders(bad, paper, tmp_path, tmp_path)
    with pytest.raises(RunFolderError, match=r"--configfile .*my config.yaml: 'my config' cannot name"):
        run_folders("", [tmp_path / "my config.yaml"], tmp_path, tmp_path)


def _claim(tmp_path, configfile, results_dir=""):
    workflow = tmp_path / "repo"
    folders = run_folders(results_dir, [configfile] if configfile else [], tmp_path, workflow)
    claim(folders, [configfile] if configfile else [], tmp_path, workflow).record()
    return folders


def test_two_configs_of_one_name_cannot_share_a_tree(tmp_path):
    """a/x.yaml and b/x.yaml both name results/x/: the second is refused, naming both files and the way out;
    the first plans again as often as it likes, also after the checkout moved (its files are recorded
    relative to the working directory). A claim alone (a dry run) writes nothing."""
    (tmp_path / "repo").mkdir()
    claim(run_folders("", ["b/x.yaml"], tmp_path, tmp_path / "repo"), ["b/x.yaml"], tmp_path, tmp_path / "repo")
    assert not (tmp_path / "results").exists()
    assert _claim(tmp_path, "a/x.yaml").results == "results/x"
    assert json.loads((tmp_path / "results/x" / OWNER).read_text())["configfiles"] == ["a/x.yaml"]
    _claim(tmp_path, tmp_path / "a/x.yaml")  # the same file, spelled absolute
    with pytest.raises(TreeOwnedError) as refused:
        _claim(tmp_path, "b/x.yaml")
    message = str(refused.value)
    assert "results/x/ holds the results of a/x.yaml, not of b/x.yaml" in message
    assert "results_dir: results/<another name>" in message and f"delete {tmp_path}/results/x/{OWNER}" in message
    assert _claim(tmp_path, "b/x.yaml", results_dir="results/x_b").results == "results/x_b"
    moved = tmp_path / "moved"
    (tmp_path / "results").rename(moved.parent / "kept")
    moved.mkdir()
    (tmp_path / "kept").rename(moved / "results")
    (moved / "repo").mkdir()
    _claim(moved, "a/x.yaml")


def test_a_config_given_another_trees_results_dir_is_refused(tmp_path):
    """The demo's own tree, another config's tree or a folder inside it: refused, naming the owner."""
    (tmp_path / "repo").mkdir()
    _claim(tmp_path, None)  # the demo's config.yaml: results/
    _claim(tmp_path, "paper.yaml")  # results/paper/ inside it: the layout of every config
    with pytest.raises(TreeOwnedError, match=r"results/ holds the results of .*config.yaml, not of seed5.yaml"):
        _claim(tmp_path, "seed5.yaml", results_dir="results")
    with pytest.raises(TreeOwnedError, match=r"lies inside .*results/paper/, the results of paper.yaml"):
        _claim(tmp_path, "mine.yaml", results_dir="results/paper/v2")
    elsewhere = tmp_path / "scratch"
    _claim(tmp_path, "big.yaml", results_dir=str(elsewhere))
    with pytest.raises(TreeOwnedError, match="the results of big.yaml"):
        _claim(tmp_path, "small.yaml", results_dir=str(elsewhere / "sub"))


@pytest.mark.parametrize("results_dir", ["src", "resources/models", "rules", ".snakemake/x", "logs/x"])
def test_results_in_the_checkouts_own_folders_are_refused(tmp_path, results_dir):
    (tmp_path / "repo").mkdir()
    with pytest.raises(TreeOwnedError, match=rf"'{results_dir}' lies in the checkout's own {results_dir.split('/')[0]}/"):
        _claim(tmp_path, "x.yaml", results_dir=results_dir)
    assert not (tmp_path / results_dir).exists()


def test_a_tree_cannot_be_one_of_the_demos_artifact_folders(tmp_path):
    (tmp_path / "repo").mkdir()
    with pytest.raises(TreeOwnedError, match=r"inside the demo's results/predictions/ folder"):
        _claim(tmp_path, "predictions.yaml")
    with pytest.raises(TreeOwnedError, match=r"inside the demo's results/tables/ folder"):
        _claim(tmp_path, "x.yaml", results_dir="results/tables/mine")


def test_every_artifact_path_starts_in_an_artifact_folder():
    """ARTIFACT_FOLDERS, which keeps other trees out of the demo's folders, names every first folder the plan
    writes to (a new kind of artifact under a new folder must be added there)."""
    paths = Paths(RunFolders("R", "L", "B"))
    found = set()
    for name in dir(Paths):
        if isinstance(getattr(Paths, name), property):
            value = getattr(paths, name)
            for path in value.values() if isinstance(value, dict) else [value]:
                if isinstance(path, str) and path.startswith("R/"):
                    found.add(path.split("/")[1])
    assert found and found <= ARTIFACT_FOLDERS, found - ARTIFACT_FOLDERS
