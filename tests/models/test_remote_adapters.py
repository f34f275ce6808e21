"""Remote-code adapters: the worker protocol, the adapter's scoring, the answer-token scan, the 5.x patches.

The worker runs as a real subprocess (this interpreter on ``remote_worker.py``)
with a model-free driver from ``tests/remote_fake_driver.py``; the tiny
random-weight checkpoints run in ``test_remote_tiny_*.py``.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from verbmirage.models import Question, create_model
from verbmirage.models.base import PLACEHOLDER_REVISION, FatalBackendError
from verbmirage.models.registry import BACKENDS, backends_of_kind
from verbmirage.models.hf import LogitsVLM, answer_token_ids
from verbmirage.models.remote import (
    InProcessClient,
    RemoteCodeVLM,
    WorkerClient,
    WorkerError,
)
from verbmirage.models.remote_driver import check_buffers, decoding_tag
from verbmirage.variants.settings import Variant
from verbmirage.models.remote_drivers import (
    install_stand_in_module,
    keep_loaded_weights,
    patch_molmo_for_transformers5,
    patch_qwen_for_transformers5,
    qwen_image_path,
)
from verbmirage.models.remote_drivers_llama import (
    MiniCPMVDriver,
    patch_minicpm_after_load,
    supply_list_to_torch_functional,
)

import remote_fake_driver as fake

FAKE = f"{Path(fake.__file__).resolve()}:FakeDriver"


@pytest.fixture
def images(tmp_path):
    paths = {}
    for name in ("yes_horse", "bench"):
        paths[name] = tmp_path / f"{name}.png"
        Image.new("RGB", (8, 8), (10, 20, 30)).save(paths[name])
    return paths


class FakeRemote(RemoteCodeVLM):
    """A remote-code adapter whose driver is the model-free one of remote_fake_driver.py."""

    backend = "fake_remote"
    driver = FAKE


def _model(tmp_path, in_process=False, **settings):
    entry = {"path": str(tmp_path), "trust_remote_code": True, "device": "cpu", **settings}
    if not in_process:
        entry.setdefault("python", sys.executable)
    return FakeRemote("m", **entry)


@pytest.mark.parametrize("backend", ["qwen_vl_chat", "molmo", "minicpm_v", "mplug_owl2"])
def test_remote_code_must_be_allowed_in_the_entry(backend):
    with pytest.raises(ValueError, match=f"models.m.trust_remote_code: backend '{backend}' runs code"):
        create_model("m", {"backend": backend, "path": "some/checkpoint"})


# ---- the shared answer-token scan (S4, S5) ----------------------------------------------------------
class ListTokenizer:
    """A tokenizer over a token list whose ``decode`` raises where Qwen's does."""

    def __init__(self, tokens, undecodable=()):
        self.tokens, self.undecodable = tokens, set(undecodable)

    def __len__(self):
        return len(self.tokens)

    def decode(self, ids):
        if ids[0] in self.undecodable:
            raise ValueError("Unclosed image token")
        return "".join(self.tokens[i] for i in ids)


class FixedLogits(LogitsVLM):
    backend = "fixed"

    def __init__(self, tokenizer, logits):
        super().__init__("fixed")
        self.tokenizer, self.logits = tokenizer, logits
        self._find_answer_tokens()

    def answer_logits(self, questions, multiple_choice):
        return self.logits.expand(len(questions), -1).clone(), [None] * len(questions)


SCAN_TOKENS = ["Yes", " yes", "yes.", "No", " no", "no,", "ności", "ność", "Yesterday", "nod", " NO!", "<img>",
               "A", " B", "(C)", "Bee"]


def test_scan_matches_whole_tokens_only():
    """Tokens like "ności"/"ność" (Qwen vocabularies) and "Yesterday"/"nod" are not answers ("ności" once counted)."""
    model = FixedLogits(ListTokenizer(SCAN_TOKENS, undecodable={11}), torch.zeros(1, len(SCAN_TOKENS)))
    assert model._yes_ids.tolist() == [0, 1, 2]
    assert model._no_ids.tolist() == [3, 4, 5, 10]
    assert model._letter_ids[0].tolist() == [12] and model._letter_ids[1].tolist() == [13]


def test_scan_tolerates_undecodable_tokens():
    """Qwen's tokenizer raises on a lone <img>; the scan skips that id instead of failing the constructor."""
    yes, no, _ = answer_token_ids(["Yes", None, "No", "<x>", None], "models.q")
    assert (yes, no) == ([0], [2])
    with pytest.raises(ValueError, match="models.q: the tokenizer has no token for 'yes' or 'no'"):
        answer_token_ids(["maybe", None], "models.q")


def test_logits_wider_than_the_tokenizer(tmp_path):
    """output-layer padding past the tokenizer takes no mass and never becomes the argmax."""
    tokens = ["Yes", "No", "A", "B"]
    logits = torch.tensor([[2.0, 1.0, 0.0, 0.0, 30.0, 30.0]])  # two padding columns, largest of all
    model = FixedLogits(ListTokenizer(tokens), logits)
    image = tmp_path / "i.png"
    Image.new("RGB", (4, 4)).save(image)
    result = model.score_yes_no([Question("q", "Is it?", image=image)])[0]
    real = torch.softmax(logits[0, :4], dim=-1)
    assert result.raw_answer == "Yes"
    assert result.confidence == pytest.approx(float(real.max()))
    assert result.p_yes == pytest.approx(math.exp(2) / (math.exp(2) + math.exp(1)))


# ---- the worker protocol and the adapter ------------------------------------------------------------
@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_scores_through_the_driver(tmp_path, images, in_process):
    model = _model(tmp_path, in_process=in_process)
    assert isinstance(model.client, InProcessClient if in_process else WorkerClient)
    assert model.vocabulary[8] is None and model.vocabulary[-1] is None and len(model.vocabulary) == 14
    questions = [Question("1", "Is someone riding a horse?", image=images["yes_horse"]),
                 Question("2", "Is someone sitting on a bench?", image=images["bench"])]
    results = model.score_yes_no(questions)
    assert [r.prediction for r in results] == ["yes", "no"]
    assert results[0].p_yes == pytest.approx(fake.expected_p_yes("yes_horse"), rel=1e-6)
    assert results[1].p_yes == pytest.approx(fake.expected_p_yes("bench"), rel=1e-6)
    real = torch.softmax(fake.FakeDriver("x").logits(str(images["bench"]), "x")[: len(fake.TOKENS)], dim=-1)
    assert results[1].raw_answer == "No" and results[1].confidence == pytest.approx(float(real.max()), rel=1e-6)
    assert results[0].raw_answer == " yes" and results[0].parse_rule == "greedy:first-token"
    mc = model.score_multiple_choice(
        [Question("3", "Which of the following actions? A. x B. y C. z", image=images["bench"], options=("x", "y", "z"))])
    assert mc[0].prediction == "C" and mc[0].raw_answer == "C"
    e = math.exp
    assert mc[0].option_probs == pytest.approx((e(1) / (e(1) + e(-5) + e(3)), e(-5) / (e(1) + e(-5) + e(3)),
                                               e(3) / (e(1) + e(-5) + e(3))), rel=1e-6)
    assert model.generate([questions[0]], max_new_tokens=4) == ["Yes, I think"]
    model.close()


@pytest.mark.parametrize("continue_tokens", [8, 0])
def test_an_answer_that_ends_at_once_is_unknown(tmp_path, images, continue_tokens):
    """End of sequence as the first token: an empty answer, unknown by the rule `empty`, whether or not the
    adapter would decode further; the first-token scores stay."""
    Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / "end_horse.png")
    model = _model(tmp_path)
    model.continue_tokens = continue_tokens
    assert model.stop_ids == {fake.END}
    yn = model.score_yes_no([Question("1", "Is someone riding a horse?", image=tmp_path / "end_horse.png")])[0]
    mc = model.score_multiple_choice([Question("2", "Which of the following actions? A. x B. y", options=("x", "y"),
                                               image=tmp_path / "end_horse.png")])[0]
    for result in (yn, mc):
        assert (result.prediction, result.raw_answer, result.parse_rule) == ("unknown", "", "greedy:empty")
    assert 0 < yn.p_yes < 1 and yn.confidence > 0.5
    model.close()


def test_a_beam_that_ends_at_once_has_its_end_tokens_probability(tmp_path, images):
    """Under beam search the checkpoint's generate ended at once although the first position's argmax is "No":
    unknown (rule `empty`), and the confidence is the end token's probability there, not the argmax's."""
    model = _model(tmp_path, in_process=True, options={"end_first": True})
    model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 3}))
    (result,) = model.score_yes_no([Question("1", "Is someone sitting on a bench?", image=images["bench"])])
    assert (result.prediction, result.raw_answer, result.parse_rule) == ("unknown", "", "beam3:empty")
    real = torch.softmax(fake.FakeDriver("x").logits(str(images["bench"]), "x")[: len(fake.TOKENS)], dim=-1)
    assert result.confidence == pytest.approx(float(real[fake.END]), rel=1e-6)
    assert float(real[fake.END]) < 0.01 < float(real.max())
    model.close()


def test_text_scoring_names_its_decoding(tmp_path, images):
    """a text answer says how it was decoded; greedy unless the entry asks for beams or a penalty."""
    greedy = _model(tmp_path, scoring="text")
    result = greedy.score_yes_no([Question("1", "Is someone riding a horse?", image=images["yes_horse"])])[0]
    assert (result.prediction, result.p_yes, result.parse_rule) == ("yes", 1.0, "text:greedy:first-word")
    beams = _model(tmp_path, scoring="text", num_beams=3, repetition_penalty=1.2)
    mc = beams.score_multiple_choice([Question("2", "Which one?", image=images["bench"], options=("a", "b", "c"))])[0]
    assert (mc.prediction, mc.parse_rule) == ("C", "text:beam3-rp1.2:letter")
    assert beams.fingerprint_extra()["decoding"] == "beam3-rp1.2"
    assert [decoding_tag(1), decoding_tag(5), decoding_tag(1, 1.05)] == ["greedy", "beam5", "greedy-rp1.05"]


def test_a_failed_question_does_not_stop_the_worker(tmp_path, images):
    model = _model(tmp_path)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    results = model.score_yes_no([Question("1", "Is it?", image=broken),
                                  Question("2", "Is it?", image=images["yes_horse"])])
    assert "broken.png" in results[0].error and results[0].prediction == "unknown"
    assert results[1].error is None and results[1].prediction == "yes"
    reply = model.client.request("score", image=str(tmp_path / "gone.png"), prompt="Which?", token_ids=[99])
    assert reply["ok"] is False and "ValueError: token id 99" in reply["error"]
    assert model.client.request("vocabulary")["ok"]


def test_a_crashed_worker_is_named_with_its_stderr(tmp_path, images):
    model = _model(tmp_path)
    with pytest.raises(FatalBackendError, match=r"models.m: the worker .* died during 'score_batch' \(exit status 3\)") as info:
        model.score_yes_no([Question("1", "Did it die?", image=images["bench"])])
    assert "fake driver loaded (this line must not reach stdout)" in str(info.value)


def test_load_failure_and_timeout_are_clear(tmp_path, images):
    with pytest.raises(WorkerError, match=r"models.m: 'load' failed: RuntimeError: cannot load"):
        _model(tmp_path, options={"crash_on_load": True})
    model = _model(tmp_path, timeout=3)
    with pytest.raises(WorkerError, match="gave no answer to 'score_batch' within 3 s"):
        model.score_yes_no([Question("1", "Will it hang?", image=images["bench"])])
    assert model.client.process.poll() is not None  # the hung worker was killed


def test_a_missing_interpreter_is_named(tmp_path):
    with pytest.raises(WorkerError, match=r"models.m: cannot start the worker with /nonexistent/bin/python"):
        _model(tmp_path, in_process=True, python="/nonexistent/bin/python")


def test_an_unknown_driver_is_named(tmp_path):
    with pytest.raises(WorkerError, match=r"models.m: 'load' failed: KeyError: .*unknown driver 'no_such'"):
        create_model("m", {"backend": "qwen_vl_chat", "path": str(tmp_path), "trust_remote_code": True,
                           "driver": "no_such", "python": sys.executable})


def test_environment_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("VERBMIRAGE_ENVS_DIR", str(tmp_path / "envs"))
    with pytest.raises(ValueError, match=r"models.m.env: environment 'remote-qwen' is not built .*tools/make_envs.sh"):
        create_model("m", {"backend": "qwen_vl_chat", "path": str(tmp_path), "trust_remote_code": True,
                           "env": "remote-qwen"})
    with pytest.raises(ValueError, match="models.m: give `python:` or `env:`, not both"):
        _model(tmp_path, env="x")


def test_fingerprint_extra_names_code_environment_and_revision(tmp_path):
    model = _model(tmp_path, revision="0123abc")
    extra = model.fingerprint_extra()
    assert extra["revision"] == "0123abc" and extra["decoding"] == "greedy"
    assert extra["code"]["remote_fake_driver.py"] == __import__("hashlib").sha256(
        Path(fake.__file__).read_bytes()).hexdigest()
    assert extra["environment"]["python"] == sys.version.split()[0] and extra["environment"]["torch"]
    assert len(extra["driver"]) == 64


# ---- checkpoint-specific helpers and the transformers 5.x patches -----------------------------------
def test_qwen_image_path_is_absolute_and_length_checked(tmp_path, monkeypatch):
    """the tokenizer carries the path in 256 byte tokens; relative paths depend on the job's cwd."""
    monkeypatch.chdir(tmp_path)
    assert qwen_image_path("i.png") == str(tmp_path / "i.png")
    long_name = "é" * 140 + ".png"  # 284 UTF-8 bytes
    with pytest.raises(ValueError, match="shorter than 256 UTF-8 bytes"):
        qwen_image_path(long_name)


def test_stand_in_module_only_for_missing_imports(monkeypatch):
    monkeypatch.delitem(sys.modules, "verbmirage_no_such_package", raising=False)
    assert install_stand_in_module("verbmirage_no_such_package") is True
    assert isinstance(sys.modules.pop("verbmirage_no_such_package"), types.ModuleType)
    assert install_stand_in_module("json") is False


def test_molmo_patch_lets_the_class_load():
    """no post_init (all_tied_weights_keys), and tie_weights(**kw) from the 5.x loader."""

    class Molmo:
        def tie_weights(self):
            raise AssertionError("old signature")

    patch_molmo_for_transformers5(Molmo)
    assert Molmo.all_tied_weights_keys == {} and Molmo().tie_weights(missing_keys=set()) is None


def test_qwen_patch_restores_meta_tensors_and_head_mask():
    """tensors stored as plain attributes stay on meta under 5.x; get_head_mask is gone."""

    class Rotary(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dim, self.base = 8, 10000
            self.inv_freq = torch.empty(4, device="meta")

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.logn_tensor = torch.empty(1, 5, 1, 1, device="meta")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attention()

    class Transformer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rotary_emb, self.h, self.wte = Rotary(), torch.nn.ModuleList([Block()]), torch.nn.Linear(2, 2)

    class LMHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer, self.config = Transformer(), types.SimpleNamespace(seq_length=4)

    model = LMHead()
    patch_qwen_for_transformers5(model)
    inv_freq = model.transformer.rotary_emb.inv_freq
    assert not inv_freq.is_meta and torch.allclose(inv_freq, 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))
    logn = model.transformer.h[0].attn.logn_tensor
    assert not logn.is_meta and logn[0, 3, 0, 0] == 1 and logn[0, 4, 0, 0] == pytest.approx(math.log(5, 4))
    assert model.transformer.get_head_mask(None, 3) == [None, None, None]


def test_minicpm_resampler_gets_list_back():
    """resampler.py takes `List` from `from torch.nn.functional import *`; torch >= 2.2 no longer has it."""
    import torch.nn.functional as functional

    had = hasattr(functional, "List")
    try:
        assert supply_list_to_torch_functional() is (not had)
        namespace = {}
        exec("from torch.nn.functional import *\nresult = List[int]", namespace)
        assert namespace["result"] == typing.List[int]
        assert supply_list_to_torch_functional() is False
    finally:
        if not had:
            del functional.List


def test_minicpm_chat_gets_the_processor_and_explicit_decoding(tmp_path):
    """chat() is handed the processor loaded once, and greedy settings (its sampling=False is beam3-rp1.2)."""

    class Recorder:
        def chat(self, **kwargs):
            self.kwargs = kwargs
            return "Yes"

    driver = MiniCPMVDriver.__new__(MiniCPMVDriver)
    driver.model, driver.tokenizer, driver.processor = Recorder(), object(), object()
    image = tmp_path / "i.png"
    Image.new("RGB", (4, 4)).save(image)
    assert driver.reference_text(str(image), "Is it?", 3) == "Yes"
    kwargs = driver.model.kwargs
    assert kwargs["processor"] is driver.processor and kwargs["sampling"] is False
    assert (kwargs["num_beams"], kwargs["repetition_penalty"], kwargs["max_new_tokens"]) == (1, 1.0, 3)


def test_paper_config_pins_every_remote_model():
    """a revision and a worker env per remote entry; the placeholder is refused until replaced."""
    paper = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs" / "paper.yaml").read_text())["models"]
    remote = {slug: e for slug, e in paper.items() if e.get("backend") in backends_of_kind("remote")}
    assert len(remote) == 4
    for slug, entry in remote.items():
        assert entry["revision"] and entry["env"] == BACKENDS[entry["backend"]].environment, slug
        assert (Path(__file__).resolve().parents[2] / "envs" / f"{entry['env']}.txt").is_file(), slug
    with pytest.raises(ValueError, match="models.m.revision: 'REPLACE-WITH-HF-COMMIT' is a placeholder"):
        create_model("m", {"backend": "molmo", "path": "allenai/Molmo-7B-D-0924", "trust_remote_code": True,
                           "revision": PLACEHOLDER_REVISION})


def test_loaded_weights_are_not_reinitialised():
    """Qwen on 5.24: _init_weights re-drew every c_proj.weight after loading; now a no-op for checkpoint classes."""

    class Base:
        def _init_weights(self, module):
            module.weight = "random"

    class Model(Base):
        pass

    Base.__module__ = Model.__module__ = "transformers_modules.ckpt.modeling_qwen"
    module = types.SimpleNamespace(weight="loaded")
    keep_loaded_weights(Model)
    Model()._init_weights(module)
    assert module.weight == "loaded"


def test_unfilled_buffers_stop_the_load():
    """5.x leaves non-persistent buffers computed in __init__ unfilled (MiniCPM's resampler table came back NaN)."""
    model = torch.nn.Module()
    model.register_buffer("table", torch.tensor([1.0, float("nan")]), persistent=False)
    with pytest.raises(RuntimeError, match="minicpm_v: buffer table was not initialised"):
        check_buffers(model, "minicpm_v")
    model.table = torch.ones(2)
    check_buffers(model, "minicpm_v")


def test_minicpm_resampler_table_is_recomputed():
    class Resampler(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.max_size, self.weight = [2, 3], torch.nn.Parameter(torch.zeros(1))
            self.register_buffer("pos_embed", torch.full((2, 3, 4), float("nan")), persistent=False)

        def _set_2d_pos_cache(self, max_size, device="cpu"):
            self.register_buffer("pos_embed", torch.ones(*max_size, 4, device=device), persistent=False)

    model = types.SimpleNamespace(resampler=Resampler())
    patch_minicpm_after_load(model)
    assert torch.equal(model.resampler.pos_embed, torch.ones(2, 3, 4))


def test_c_level_prints_and_stray_replies_go_to_the_log_not_the_protocol(tmp_path, images):
    """Checkpoint code that writes to file descriptor 1 (a C library's print, or a line that looks like a reply)
    reaches stderr; the answers are those of a quiet driver."""
    quiet = _model(tmp_path)
    expected = quiet.score_yes_no([Question("1", "Is someone riding a horse?", image=images["yes_horse"])])
    quiet.close()
    for option in ("c_print", "stray_reply"):
        model = _model(tmp_path, options={option: True})
        results = model.score_yes_no([Question("1", "Is someone riding a horse?", image=images["yes_horse"])] * 3)
        assert all(result == expected[0] for result in results), option
        model.close()
        assert "cudnn not found" in model.client.stderr_tail() if option == "c_print" else \
            '"id": 1' in model.client.stderr_tail()


def test_the_worker_runs_from_its_files_alone_without_the_package(tmp_path):
    """A remote-code environment has neither the package nor the project's pins: the worker's files
    (``remote_worker.FILES``), copied to a folder of their own, serve the protocol on the standard library alone
    (``-S``: no site-packages, so no verbmirage, torch or transformers), and name every driver."""
    import json
    import subprocess

    from verbmirage.models import remote_worker

    here = Path(remote_worker.__file__).parent
    for name in remote_worker.FILES:
        (tmp_path / name).write_bytes((here / name).read_bytes())
    requests = [{"op": "vocabulary", "id": 1}, {"op": "load", "driver": "nobody", "path": "x", "id": 2},
                {"op": "shutdown", "id": 3}]
    done = subprocess.run([sys.executable, "-S", "-u", str(tmp_path / "remote_worker.py")], cwd=tmp_path,
                          input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, text=True,
                          timeout=60)
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert done.returncode == 0, done.stderr
    assert [r["id"] for r in replies] == [1, 2, 3] and replies[2]["ok"]
    assert "'vocabulary' before 'load'" in replies[0]["error"]
    assert "unknown driver 'nobody'" in replies[1]["error"]
    for driver in ("qwen_vl_chat", "molmo", "minicpm_v", "mplug_owl2"):
        assert driver in replies[1]["error"]


def test_a_reply_to_another_request_stops_the_worker(tmp_path, monkeypatch):
    """Replies are matched to requests by id: one that answers another request (or none) is a named
    WorkerError, never an answer handed to the wrong question."""
    import verbmirage.models.remote as remote

    script = tmp_path / "liar.py"
    script.write_text("import json, sys\nfor line in sys.stdin:\n"
                      "    request = json.loads(line)\n"
                      "    print(json.dumps({'ok': True, 'id': request['id'] + 1}), flush=True)\n")
    monkeypatch.setattr(remote, "WORKER_SCRIPT", script)
    client = WorkerClient(sys.executable, "models.liar", timeout=10)
    with pytest.raises(WorkerError, match=r"models\.liar: .* answered request 2 where request 1 \('score'\) was due"):
        client.request("score")
    assert client.process.poll() is not None  # stopped: the replies can no longer be matched


def test_non_finite_scores_are_error_rows_naming_model_question_and_image(tmp_path, images):
    Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / "nan_bench.png")
    model = _model(tmp_path, options={"nan": True})
    results = model.score_yes_no([Question("q-nan", "Is someone sitting on a bench?", image=tmp_path / "nan_bench.png"),
                                  Question("q-ok", "Is someone sitting on a bench?", image=images["bench"])])
    assert results[0].error is not None and results[0].prediction == "unknown"
    for part in ("models.m", "q-nan", "nan_bench.png", "not a finite number"):
        assert part in results[0].error, part
    assert results[1].error is None and results[1].prediction == "no"
    model.close()


def test_a_remote_code_job_sizes_its_batch_from_what_its_driver_reports(tmp_path):
    """The driver's ``memory_geometry`` travels in the worker's ``load`` reply; on a GPU reading the job sizes its
    batch from it, smaller under beam search; a driver that reports nothing keeps the configured default."""
    from verbmirage.inference.sizing import AUTO, DEFAULT_BATCH_SIZE, choose_batching, sized_batch
    from verbmirage.models.memory import remote_memory_costs

    geometry = dict(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, intermediate=11008, vocab=32000,
                    image_tokens=65, vision_tokens=1025, vision_layers=24, vision_hidden=1024, weights=14 * 2**30,
                    itemsize=2)
    h200 = 140 * 2**30
    reading = lambda: (h200 - geometry["weights"], h200)  # noqa: E731 - a fake device reading
    model = _model(tmp_path, options={"memory": geometry}, max_new_tokens=4)
    try:
        assert model.memory_costs() == remote_memory_costs(geometry, "cpu", beams=1, new_tokens=8)
        images = [f"i{i // 10}.jpg" for i in range(200)]
        greedy = choose_batching(model, AUTO, None, images, memory=reading)
        assert greedy.record["source"] == "sized" and model.batch_size == greedy.batch_size
        assert greedy.batch_size == sized_batch(model.memory_costs(), *reading(), 10.0)
        model.use_variant(Variant.from_config({"decoding": "beam", "num_beams": 5}))
        beams = choose_batching(model, AUTO, None, images, memory=reading)
        assert beams.batch_size < greedy.batch_size and beams.record["measured"]["per_row"] == \
            remote_memory_costs(geometry, "cpu", beams=5, new_tokens=8).per_row
    finally:
        model.close()
    silent = _model(tmp_path)
    try:
        assert silent.memory_costs() is None
        assert choose_batching(silent, AUTO, None, ["a.jpg"], memory=reading).batch_size == DEFAULT_BATCH_SIZE
    finally:
        silent.close()
