"""mPLUG-Owl2 end to end on a tiny random-weight model built from the ``mplug_owl2`` package's own classes.

The package comes from ``../shared/remote_code/mplug_owl2`` (never copied into
the repository) and runs, with the adapter's worker, in the environment
``configs/paper.yaml`` names for the model (transformers 4.31, built by
``tools/make_envs.sh``). The golden prompt is the package's
``conv_templates["mplug_owl2"]`` text as its README shows it. The tests at the
end (import errors) need neither the env nor the code folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remote_tiny import (
    check_batches_equal_one_at_a_time,
    check_memory_geometry,
    REMOTE_CODE,
    check_beam_and_sampling,
    check_scores,
    envs_dir,
    first_greedy_answer,
    module_images,
    tiny_entry,
    worker_env,
)

from verbmirage.models import Question, create_model
from verbmirage.models.remote import WorkerError

CODE_DIR = REMOTE_CODE / "mplug_owl2"
BUILDER = Path(__file__).resolve().parents[1] / "remote_tiny_mplug_build.py"
IMAGE_TOKEN_INDEX, BOS = -200, 1
YN = "Is someone riding a horse?\nAnswer yes or no."


def golden_prompt(question: str) -> str:
    """``conv_templates["mplug_owl2"]``: TWO_NO_SYS, roles USER/ASSISTANT, the image tag first."""
    return f"USER: <|image|>{question} ASSISTANT:"


@pytest.fixture(scope="module")
def env() -> str:
    """The env the paper config names, or skip (fail where VERBMIRAGE_REQUIRE_REMOTE_ENVS=1) when it is missing."""
    return worker_env("mplug_owl2")


@pytest.fixture(scope="module")
def checkpoint(env, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("tiny_mplug_owl2")
    result = subprocess.run([str(envs_dir() / env / "bin" / "python"), str(BUILDER), str(CODE_DIR), str(target)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return target


def make_model(env: str, checkpoint: Path, **settings):
    """The paper config's entry, pointed at the tiny checkpoint (a local folder: pinned by its files), on CPU."""
    entry = tiny_entry("mplug_owl2", env, checkpoint, options={"code_dir": str(CODE_DIR)}, max_new_tokens=4)
    return create_model("mplug_owl2", {**entry, **settings})


@pytest.fixture(scope="module")
def mplug(env, checkpoint):
    model = make_model(env, checkpoint)
    yield model
    model.close()


images = module_images("mplug_images", [((64, 48), (200, 30, 30)), ((40, 72), (20, 180, 40))])


def test_constructor_runs_the_package_in_its_env(mplug):
    """the package imports and the model loads (transformers 4.31 in the worker, not the job's 5.x)."""
    assert mplug.environment["transformers"] == "4.31.0"
    assert "modeling_mplug_owl2.py" in mplug.code and "visual_encoder.py" in mplug.code
    assert mplug.vocab_size == mplug.tokenizer_size == len(mplug.vocabulary)
    words = {mplug.vocabulary[i].strip() for i in mplug._yes_ids + mplug._no_ids}
    assert words == {"Yes", "yes", "No", "no"}
    assert mplug.vocabulary[mplug._letter_ids[0][0]].strip() == "A"


def test_prompt_equals_the_package_conversation(mplug, images):
    """The README's prompt; one BOS, and the image as IMAGE_TOKEN_INDEX right after ``USER: ``."""
    question = Question("q", "Is someone riding a horse?", image=images[0])
    assert mplug.prompt_text(question, multiple_choice=False) == golden_prompt(YN)
    ids = mplug.client.request("prompt", image=str(images[0]), prompt=YN)["ids"]
    assert ids[0] == BOS and ids.count(BOS) == 1 and ids.count(IMAGE_TOKEN_INDEX) == 1
    image = ids.index(IMAGE_TOKEN_INDEX)

    def spelled(part):
        return "".join("".join(mplug.vocabulary[i] or "?" for i in part).split())

    assert spelled(ids[1:image]) == "USER:"
    assert spelled(ids[image + 1 :]) == "".join((YN + " ASSISTANT:").split())


def test_yes_no_and_multiple_choice_scores(mplug, images):
    mc = check_scores(mplug, images, images[0], ("riding", "feeding", "washing"))
    assert all(p > 0 for p in mc.option_probs)


def test_logits_equal_the_model_as_built(mplug, checkpoint):
    """The adapter's logits row (saved, reloaded, run through the worker) equals the package's own forward
    on the model before it was saved (README steps, in the builder)."""
    probe = json.loads((checkpoint / "probe.json").read_text())
    row = mplug.client.request("score", image=str(checkpoint / "probe.png"), prompt=probe["question"],
                               token_ids=list(range(len(probe["logits"]))))
    assert row["ok"], row
    assert row["logits"] == pytest.approx(probe["logits"], abs=1e-4)


def test_logits_argmax_is_the_first_greedy_token(mplug, images):
    """The scored position is where generation starts; decoding is greedy, tagged and equals the README's."""
    for image in images:
        first = first_greedy_answer(mplug, image, YN)
        official = mplug.client.request("reference", image=str(image), prompt=YN, max_new_tokens=3)
        assert official["ok"], official
        assert first["text"] == official["text"]


def test_bfloat16_text_scoring(env, checkpoint, images, mplug):
    """One more worker, in bfloat16 and scoring from text with 2 beams.

    the pixels follow the weights' dtype (the package's builder forced
    float16 whatever was asked), so bf16 logits come out close to float32's.
    ``scoring: text`` parses a decoded answer and names its decoding.
    """
    model = make_model(env, checkpoint, dtype="bfloat16", scoring="text", num_beams=2)
    try:
        result = model.score_yes_no([Question("t", "Is someone riding a horse?", image=images[0])])[0]
        low = model.client.request("score", image=str(images[0]), prompt=YN, token_ids=mplug._yes_ids)
    finally:
        model.close()
    assert result.error is None and result.parse_rule.startswith("text:beam2:")
    full = mplug.client.request("score", image=str(images[0]), prompt=YN, token_ids=mplug._yes_ids)
    assert low["ok"], low
    assert low["logits"] == pytest.approx(full["logits"], abs=0.1) and low["logits"] != full["logits"]
    assert low["logsumexp"] == pytest.approx(full["logsumexp"], abs=0.1)


def test_a_hub_id_loads_at_its_pinned_revision(env, checkpoint, images, tmp_path, monkeypatch):
    """``revision`` chooses the snapshot a hub id loads (here from an offline hub cache), not ``main``."""
    pinned, main = "0123456789abcdef0123456789abcdef01234567", "fedcba9876543210fedcba9876543210fedcba98"
    repo = tmp_path / "hub" / "models--example--tiny-mplug-owl2"
    shutil.copytree(checkpoint, repo / "snapshots" / pinned)
    (repo / "snapshots" / main).mkdir(parents=True)
    (repo / "snapshots" / main / "config.json").write_text("{not json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(main)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = make_model(env, checkpoint, path="example/tiny-mplug-owl2", revision=pinned)
    try:
        result = model.score_yes_no([Question("r", "Is someone riding a horse?", image=images[0])])[0]
    finally:
        model.close()
    assert result.error is None and model.fingerprint_extra()["revision"] == pinned
    with pytest.raises(WorkerError, match="'load' failed: .*(JSON|json)"):
        make_model(env, checkpoint, path="example/tiny-mplug-owl2", revision=main)


# ---- import errors: no env needed (the worker runs on this interpreter) -----------------------------
def load_error(tmp_path: Path, options: dict) -> str:
    with pytest.raises(WorkerError) as caught:
        create_model("mplug_owl2", {"backend": "mplug_owl2", "path": str(tmp_path), "trust_remote_code": True,
                                    "device": "cpu", "dtype": "float32", "python": sys.executable, "options": options})
    return str(caught.value)


def test_an_import_error_inside_the_package_is_shown_as_itself(tmp_path, monkeypatch):
    """a module the package needs is missing: the message names it, not "install mplug_owl2".

    ``code_dir`` is relative here: it means the job's directory, not the worker's.
    """
    package = tmp_path / "code" / "mplug_owl2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("import icecream_not_installed_here\n")
    monkeypatch.chdir(tmp_path)
    message = load_error(tmp_path, {"code_dir": "code"})
    assert "No module named 'icecream_not_installed_here'" in message
    assert "not importable in this environment" not in message


def test_a_missing_package_says_how_to_provide_it(tmp_path):
    message = load_error(tmp_path, {})
    assert "mplug_owl2 package is not importable" in message and "code_dir" in message
    message = load_error(tmp_path, {"code_dir": str(tmp_path / "nowhere")})
    assert "no mplug_owl2/__init__.py" in message and str(tmp_path / "nowhere") in message


def test_beam_search_and_sampling_are_the_checkpoints_own(mplug, images):
    check_beam_and_sampling(mplug, images[0])


def test_batches_answer_as_one_question_at_a_time(mplug, images):
    """Scores on one image prefix per image, and decoding: prompts of one length batched through its generate (it cannot pad)."""
    check_batches_equal_one_at_a_time(mplug, images)


def test_the_driver_reports_what_the_batch_sizing_reads(mplug, images):
    check_memory_geometry(mplug, images[0])
