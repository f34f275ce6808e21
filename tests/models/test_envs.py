"""tools/make_envs.sh: worker envs built once per machine, keyed by what goes into them, shared torch base.

Real venvs and real pip installs, offline: the requirements name small wheels
written by the test into a local folder (one of them called ``torch`` so the
shared-base path runs without the real gigabytes).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "make_envs.sh"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

pytestmark = pytest.mark.skipif(shutil.which(f"python{PYTHON}") is None, reason=f"needs python{PYTHON} on PATH")


def write_wheel(folder: Path, name: str, version: str, body: str) -> None:
    """A minimal pure-Python wheel: one module ``name`` and its metadata."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": body,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join(record + [f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


@pytest.fixture()
def layout(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels, "torch", "0.0.1", "WHO = 'the shared base'\n")
    write_wheel(wheels, "vmtinyone", "1.0", "X = 1\n")
    write_wheel(wheels, "vmtinytwo", "1.0", "X = 2\n")
    files = tmp_path / "envfiles"
    files.mkdir()
    return {"tmp": tmp_path, "wheels": wheels, "files": files, "cache": tmp_path / "cache",
            "links": tmp_path / "clone1" / ".envs"}


def write_env_file(layout, name: str, *requirements: str, python: str = PYTHON) -> Path:
    path = layout["files"] / f"{name}.txt"
    path.write_text(f"# test env\n# python: {python}\n--no-index\n--find-links {layout['wheels']}\n"
                    + "".join(f"{line}   # pinned\n" for line in requirements))
    return path


def make_envs(layout, *args: str, links: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "VERBMIRAGE_ENV_CACHE": str(layout["cache"]), "VERBMIRAGE_ENV_FILES": str(layout["files"]),
           "VERBMIRAGE_ENVS_DIR": str(links or layout["links"]), "PIP_CONFIG_FILE": os.devnull}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


def run_in(env_dir: Path, code: str) -> str:
    return subprocess.run([str(env_dir / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_env_is_built_once_and_reused_by_hash(layout):
    write_env_file(layout, "remote-demo", "torch==0.0.1", "vmtinyone==1.0")
    first = make_envs(layout)  # no name: every remote-*.txt
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("building") == 2  # the torch base and the env
    link = layout["links"] / "remote-demo"
    assert link.is_symlink() and Path(os.readlink(link)).parent == layout["cache"]
    # torch comes from the shared base through a .pth file, the rest from the env itself
    assert "/base-" in run_in(link, "import torch; print(torch.__file__)")
    assert run_in(link, "import vmtinyone, torch; print(vmtinyone.X, torch.WHO)") == "1 the shared base"

    again = make_envs(layout, "demo")  # the "remote-" prefix may be left out
    assert again.returncode == 0 and "building" not in again.stdout and again.stdout.count("reusing") == 2

    clone = layout["tmp"] / "clone2" / ".envs"  # a fresh clone on the same machine: linked, not rebuilt
    fresh = make_envs(layout, "remote-demo", links=clone)
    assert fresh.returncode == 0 and "building" not in fresh.stdout
    assert os.readlink(clone / "remote-demo") == os.readlink(link)

    comments_only = layout["files"] / "remote-demo.txt"
    comments_only.write_text("# reworded comment\n" + comments_only.read_text())
    assert "building" not in make_envs(layout, "remote-demo").stdout  # comments are not part of the key

    write_env_file(layout, "remote-demo", "torch==0.0.1", "vmtinyone==1.0", "vmtinytwo==1.0")
    changed = make_envs(layout, "remote-demo")
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.count("building") == 1 and changed.stdout.count("reusing") == 1  # new env, same base
    assert os.readlink(link) != os.readlink(clone / "remote-demo")
    assert run_in(link, "import vmtinytwo; print(vmtinytwo.X)") == "2"


def test_a_half_built_env_is_rebuilt(layout):
    write_env_file(layout, "remote-demo", "vmtinyone==1.0")
    assert make_envs(layout).returncode == 0
    target = Path(os.readlink(layout["links"] / "remote-demo"))
    (target / ".verbmirage-env").unlink()  # as if the build had been killed before its stamp
    rebuilt = make_envs(layout)
    assert rebuilt.returncode == 0 and f"building {target}" in rebuilt.stdout
    assert run_in(target, "import vmtinyone; print(vmtinyone.X)") == "1"


def test_check_names_missing_and_stale_envs(layout):
    write_env_file(layout, "remote-demo", "vmtinyone==1.0")
    missing = make_envs(layout, "--check", "remote-demo")
    assert missing.returncode == 1
    assert "env 'remote-demo' is not built" in missing.stderr and "run tools/make_envs.sh remote-demo" in missing.stderr
    assert make_envs(layout, "remote-demo").returncode == 0
    assert make_envs(layout, "--check").returncode == 0
    write_env_file(layout, "remote-demo", "vmtinyone==1.0", "vmtinytwo==1.0")
    stale = make_envs(layout, "--check", "remote-demo")
    assert stale.returncode == 1 and "is stale" in stale.stderr


def test_a_failed_install_names_the_env_file_and_leaves_no_link(layout):
    path = write_env_file(layout, "remote-demo", "vmtinyone==9.9")  # no such version in the wheel folder
    failed = make_envs(layout, "remote-demo")
    assert failed.returncode == 1 and f"pip could not install the requirements of {path}" in failed.stderr
    assert not (layout["links"] / "remote-demo").exists()
    write_env_file(layout, "remote-demo", "vmtinyone==1.0")
    assert make_envs(layout, "remote-demo").returncode == 0


def test_bad_names_and_interpreters_are_named(layout):
    write_env_file(layout, "remote-demo", "vmtinyone==1.0")
    unknown = make_envs(layout, "remote-nothing")
    assert unknown.returncode == 1 and "no env file for 'remote-nothing'" in unknown.stderr
    assert "remote-demo" in unknown.stderr  # the known names
    path = write_env_file(layout, "remote-old", "vmtinyone==1.0", python="2.9")
    old = make_envs(layout, "remote-old")
    assert old.returncode == 1 and f"{path} asks for python 2.9" in old.stderr and "PYTHON_2_9" in old.stderr
    assert not (layout["links"] / "remote-old").exists()


def test_every_model_env_has_a_matching_conda_form():
    """envs/remote-<model>.yaml installs the same pins (-r the .txt) on the python the .txt asks for."""
    import yaml

    names = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True).stdout.split()
    models = {"remote-qwen_vl_chat", "remote-molmo", "remote-minicpm_v", "remote-mplug_owl2"}
    assert models <= set(names)
    for name in models | {n for n in names if (REPO / "envs" / f"{n}.yaml").exists()}:
        txt = (REPO / "envs" / f"{name}.txt").read_text()
        python = next(line.split(":", 1)[1].strip() for line in txt.splitlines() if line.startswith("# python:"))
        conda = yaml.safe_load((REPO / "envs" / f"{name}.yaml").read_text())
        assert f"python={python}" in conda["dependencies"], name
        pip = next(item["pip"] for item in conda["dependencies"] if isinstance(item, dict))
        assert pip == [f"-r {name}.txt"], name
