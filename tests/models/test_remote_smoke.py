"""tools/remote_smoke.py: goldens stored on the first run, re-checked later, every difference printed.

The models are remote-code entries whose driver is a fake (no weights), run
through the real worker protocol in a subprocess of this interpreter (and,
where a test only varies the answers, in-process to save the start-up).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from remote_fake_driver import expected_p_yes

REPO = Path(__file__).resolve().parents[2]
DRIVER = f"{Path(__file__).resolve().parents[1] / 'remote_smoke_driver.py'}:ShiftedDriver"


def load_cli():
    spec = importlib.util.spec_from_file_location("remote_smoke", REPO / "tools" / "remote_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def setup(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (32, 24), (200, 30, 30)).save(images / "a_yes.png")
    Image.new("RGB", (24, 32), (20, 180, 40)).save(images / "b.png")
    (images / "notes.txt").write_text("not an image")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    return {"tmp": tmp_path, "images": images, "checkpoint": checkpoint, "goldens": tmp_path / "g" / "smoke.json"}


def write_config(setup, shift: float = 0.0, worker: bool = True, **extra_models) -> Path:
    """A config with the fake remote model (in a worker process, or in-process where speed matters) and a baseline."""
    fake = {"backend": "mplug_owl2", "path": str(setup["checkpoint"]), "trust_remote_code": True,
            "driver": DRIVER, "dtype": "float32", "device": "cpu", "options": {"shift": shift}, "batch_size": 4,
            "resources": {"gpu": 1}, **({"python": sys.executable} if worker else {})}
    config = {"models": {"fake_remote": fake, "blind": {"backend": "always_yes"}, **extra_models}}
    path = setup["tmp"] / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def smoke(setup, config: Path, *extra: str, capsys=None) -> tuple[int, str]:
    code = load_cli().main(["--config", str(config), "--images", str(setup["images"]),
                            "--goldens", str(setup["goldens"]), *extra])
    return code, capsys.readouterr().out if capsys else ""


def test_first_run_stores_goldens_and_the_next_run_matches(setup, capsys):
    config = write_config(setup)
    code, out = smoke(setup, config, capsys=capsys)
    assert code == 0 and "stored fake_remote" in out and "blind" not in out  # blind baselines are not remote
    goldens = json.loads(setup["goldens"].read_text())
    record = goldens["models"]["fake_remote"]
    assert set(record["images"]) == {"a_yes.png", "b.png"}  # notes.txt is not an image
    assert record["answers"]["a_yes.png|yn"]["p_yes"] == pytest.approx(expected_p_yes("a_yes.png"), abs=1e-6)
    assert record["answers"]["b.png|yn"]["prediction"] == "no"
    assert record["answers"]["a_yes.png|mc"]["prediction"] == "C"
    assert record["answers"]["a_yes.png|text"]["text"] == "Yes, I think"
    assert record["fingerprint"]["environment"]["python"] and record["fingerprint"]["decoding"] == "greedy"

    code, out = smoke(setup, config, capsys=capsys)
    assert code == 0 and "ok fake_remote: every answer matches" in out
    assert json.loads(setup["goldens"].read_text()) == goldens  # a matching run rewrites nothing


def test_drift_is_printed_answer_by_answer_and_update_accepts_it(setup, capsys):
    smoke(setup, write_config(setup, worker=False), capsys=capsys)
    moved = write_config(setup, shift=8.0, worker=False)
    code, out = smoke(setup, moved, capsys=capsys)
    assert code == 1 and "DIFF fake_remote" in out
    assert "a_yes.png|yn: prediction 'yes' -> 'no'" in out
    assert "a_yes.png|yn: p_yes 0.9987 -> 0.3347 (|diff| 0.6640 > tolerance 0.02)" in out
    assert "a_yes.png|text: text 'Yes, I think' -> 'No, I think'" in out
    assert "b.png|yn: p_yes" not in out  # already "no": its P(yes) moves by less than the tolerance
    assert "b.png|mc" not in out  # MC answers did not move

    code, out = smoke(setup, moved, "--update", capsys=capsys)
    assert code == 0 and "stored fake_remote" in out
    code, out = smoke(setup, moved, capsys=capsys)
    assert code == 0 and "ok fake_remote" in out


def test_a_tolerance_and_changed_images(setup, capsys):
    smoke(setup, write_config(setup, worker=False), capsys=capsys)
    slight = write_config(setup, shift=-0.1, worker=False)  # b.png: confidence 0.5734 -> 0.5488, within a 0.05 tolerance
    assert smoke(setup, slight, "--tolerance", "0.05", capsys=capsys)[0] == 0
    code, out = smoke(setup, slight, capsys=capsys)
    assert code == 1 and "b.png|yn: confidence 0.5734 -> 0.5488 (|diff| 0.0246 > tolerance 0.02)" in out
    with_dtype = yaml.safe_load(slight.read_text())
    with_dtype["models"]["fake_remote"]["dtype"] = "bfloat16"
    slight.write_text(yaml.safe_dump(with_dtype))
    code, out = smoke(setup, slight, "--tolerance", "0.05", capsys=capsys)
    assert code == 0 and "(changed since the goldens: dtype float32 -> bfloat16)" in out
    assert "b.png|yn: p_yes" not in out and "a_yes.png" not in out
    Image.new("RGB", (24, 32), (0, 0, 255)).save(setup["images"] / "b.png")
    code, out = smoke(setup, write_config(setup, worker=False), capsys=capsys)
    assert code == 1 and "image b.png: its bytes changed since the goldens were stored" in out


def test_a_model_that_cannot_load_fails_alone(setup, capsys):
    broken = {"backend": "molmo", "path": str(setup["checkpoint"]), "trust_remote_code": True,
              "python": sys.executable, "driver": DRIVER, "device": "cpu", "options": {"crash_on_load": True}}
    code, out = smoke(setup, write_config(setup, broken=broken), capsys=capsys)
    assert code == 1 and "stored fake_remote" in out
    assert "FAIL broken: could not load: WorkerError" in out and "cannot load" in out
    assert "broken" not in json.loads(setup["goldens"].read_text())["models"]


def test_bad_arguments_are_named(setup, capsys):
    config = write_config(setup)
    code = load_cli().main(["--config", str(config), "--images", str(setup["images"]), "--models", "nope"])
    assert code == 2 and "--models: ['nope'] not in the config's models" in capsys.readouterr().err
    empty = setup["tmp"] / "empty"
    empty.mkdir()
    code = load_cli().main(["--config", str(config), "--images", str(empty)])
    assert code == 2 and f"--images {empty}: no image files" in capsys.readouterr().err
    code = load_cli().main(["--config", str(config), "--images", str(setup["images"]), "--models", "blind"])
    assert code == 2 and "models.blind: backend 'always_yes' is not a remote-code backend" in capsys.readouterr().err
    setup["goldens"].parent.mkdir(parents=True)
    setup["goldens"].write_text("{}")
    code = load_cli().main(["--config", str(config), "--images", str(setup["images"]),
                            "--goldens", str(setup["goldens"])])
    assert code == 2 and "not a version-1 goldens file" in capsys.readouterr().err
