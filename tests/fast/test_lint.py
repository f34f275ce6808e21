"""The code's lint: ruff on the whole tree (its settings in pyproject.toml, and scripts/ruff.toml for the Snakemake
scripts) and snakefmt on the workflow's files. Snakemake's own lint is in tests/workflow/test_workflow_lint.py (it
starts Snakemake)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _ruff(*arguments: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    # --no-cache: no .ruff_cache folder left in the checkout
    return subprocess.run([sys.executable, "-m", "ruff", *arguments, "--no-cache", "--output-format", "concise"],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing_in_the_tree():
    checked = _ruff("check", ".")
    assert checked.returncode == 0, f"`ruff check` finds these (fix them; see pyproject.toml [tool.ruff]):\n" \
                                    f"{checked.stdout}{checked.stderr}"


def test_a_script_may_use_snakemake_but_no_other_undefined_name(tmp_path):
    """scripts/ruff.toml: the injected ``snakemake`` is known in the scripts, a typo of it is not, and the
    package knows no ``snakemake`` global at all."""
    body = "from pathlib import Path\n\nPath(snakemake.output[0]).touch()\n"
    scripts, package = tmp_path / "scripts", tmp_path / "src"
    for folder in (scripts, package):
        folder.mkdir()
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    (scripts / "ruff.toml").write_text((REPO / "scripts" / "ruff.toml").read_text())
    (scripts / "good.py").write_text(body)
    (scripts / "typo.py").write_text(body.replace("snakemake.", "snakemak."))
    (package / "module.py").write_text(body)
    found = _ruff("check", ".", cwd=tmp_path).stdout
    assert "good.py" not in found, found
    assert "typo.py:3:6: F821 Undefined name `snakemak`" in found, found
    assert "module.py:3:6: F821 Undefined name `snakemake`" in found, found


def test_snakefmt_leaves_the_workflow_files_as_they_are():
    """`snakefmt --check` on rules/ and the Snakefile, with its settings in pyproject.toml ([tool.snakefmt])."""
    checked = subprocess.run([sys.executable, "-m", "snakefmt", "--check", "--compact-diff", "rules", "Snakefile"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, ("snakefmt would change these (run `.venv/bin/snakefmt rules/ Snakefile`, then "
                                     f"check that `snakemake -n` plans the same jobs):\n{checked.stdout}{checked.stderr}")

