"""Each config its own results tree (README, "Several configs in one checkout"; src/verbmirage/workflow/run_folders.py)."""

import pytest

from verbmirage.workflow.run_folders import RunFolderError, RunFolders, run_folders


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
