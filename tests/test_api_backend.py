"""The OpenAI-compatible backend against a real HTTP server on loopback."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from verbmirage.models import Question, create_model

KEY = "sk-test-very-secret-0123456789"


def _completion(text: str, top: list[tuple[str, float]] | None) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if top is not None:
        choice["logprobs"] = {"content": [{"token": top[0][0], "logprob": top[0][1],
                                           "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top]}]}
    return {"id": "x", "object": "chat.completion", "choices": [choice]}


class Behaviour:
    """What the server answers, per question text and attempt number."""

    def __init__(self):
        self.attempts: dict[str, int] = {}
        self.auth: set[str] = set()
        self.images: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()

    def respond(self, question: str, attempt: int) -> tuple[int, dict, dict | str, float]:
        yes = [(" Yes", -0.1), (" No", -2.5), ("yes", -4.0)]
        if question.startswith("rate limited") and attempt == 1:
            return 429, {"Retry-After": "0"}, {"error": "slow down"}, 0
        if question.startswith("flaky") and attempt == 1:
            return 500, {}, {"error": "boom"}, 0
        if question.startswith("slow") and attempt == 1:
            return 200, {}, _completion("Yes", yes), 1.5
        if question.startswith("broken"):
            return 503, {}, f"upstream said: bad key {KEY}", 0
        if question.startswith("invalid"):
            return 400, {}, {"error": "bad request"}, 0
        if question.startswith("text only"):
            return 200, {}, _completion("No.", None), 0
        if question.startswith("Which"):
            return 200, {}, _completion("B", [("B", -0.2), ("A", -2.0), (" C", -3.0), ("Yes", -5.0)]), 0
        return 200, {}, _completion("Yes", yes), 0


@pytest.fixture
def server():
    behaviour = Behaviour()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            content = body["messages"][0]["content"]
            question = content[0]["text"]
            with behaviour.lock:
                behaviour.auth.add(self.headers.get("Authorization"))
                behaviour.attempts[question] = behaviour.attempts.get(question, 0) + 1
                attempt = behaviour.attempts[question]
                behaviour.in_flight += 1
                behaviour.max_in_flight = max(behaviour.max_in_flight, behaviour.in_flight)
                behaviour.images += [c["image_url"]["url"][:22] for c in content[1:]]
            status, headers, payload, delay = behaviour.respond(question, attempt)
            time.sleep(delay + 0.05)
            with behaviour.lock:
                behaviour.in_flight -= 1
            data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
            try:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on a slow answer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", behaviour
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def model(server, monkeypatch):
    url, _ = server
    monkeypatch.setenv("VM_TEST_KEY", KEY)
    settings = {"backend": "openai", "model": "gpt-test", "base_url": url, "api_key_env": "VM_TEST_KEY",
                "max_concurrency": 2, "max_retries": 2, "timeout": 0.5, "backoff": 0.01}
    return create_model("api", settings)


def test_yes_no_with_retries_and_logprobs(model, server, tmp_path, caplog):
    url, behaviour = server
    image = tmp_path / "img.jpg"
    Image.new("RGB", (8, 8)).save(image)
    names = ["plain", "rate limited", "flaky", "slow", "broken", "invalid", "text only"]
    questions = [Question(f"q{i}", f"{name} question?", image=image) for i, name in enumerate(names)]
    caplog.set_level(logging.DEBUG)
    results = {name: r for name, r in zip(names, model.score_yes_no(questions))}
    yes_mass, no_mass = math.exp(-0.1) + math.exp(-4.0), math.exp(-2.5)  # " Yes" and "yes" both count
    expected = yes_mass / (yes_mass + no_mass)
    assert results["plain"].p_yes == pytest.approx(expected)
    assert results["plain"].confidence == pytest.approx(math.exp(-0.1))
    assert results["plain"].parse_rule == "logprobs" and results["plain"].prediction == "yes"
    for name in ("rate limited", "flaky", "slow"):
        assert results[name].prediction == "yes" and results[name].error is None, name
    assert results["text only"].prediction == "no" and results["text only"].p_yes == 0.0
    assert results["text only"].parse_rule == "text:first-word"
    assert results["broken"].error and "gave up after 3 attempts" in results["broken"].error
    assert results["invalid"].error.startswith("HTTP 400")
    attempts = {q.split(" question")[0]: n for q, n in behaviour.attempts.items()}
    assert attempts == {"plain": 1, "rate limited": 2, "flaky": 2, "slow": 2, "broken": 3, "invalid": 1, "text only": 1}
    assert behaviour.max_in_flight <= 2
    assert behaviour.auth == {f"Bearer {KEY}"}
    assert set(behaviour.images) == {"data:image/jpeg;base64"}
    # the key never leaks: not in errors, logs or the object's repr
    assert KEY not in results["broken"].error and "***" in results["broken"].error
    assert all(KEY not in record.getMessage() for record in caplog.records)
    assert KEY not in repr(model)
    assert any("retry" in record.getMessage() for record in caplog.records)


def test_multiple_choice_from_letter_logprobs(model, tmp_path):
    image = tmp_path / "img.png"
    Image.new("RGB", (8, 8)).save(image)
    question = Question("m", "Which of the following actions is present in the image?\nA. a\nB. b\nC. c\nD. d",
                        image=image, options=("a", "b", "c", "d"))
    result = model.score_multiple_choice([question])[0]
    masses = [math.exp(-2.0), math.exp(-0.2), math.exp(-3.0), 0.0]
    assert result.prediction == "B"
    assert result.option_probs == pytest.approx(tuple(m / sum(masses) for m in masses))


def test_missing_key_variable_is_named(monkeypatch):
    monkeypatch.delenv("NOT_SET_KEY", raising=False)
    with pytest.raises(ValueError, match="models.api.api_key_env: environment variable NOT_SET_KEY is not set"):
        create_model("api", {"backend": "openai", "model": "m", "api_key_env": "NOT_SET_KEY"})


def test_key_not_in_written_predictions(model, tmp_path, demo_anno, demo_roots):
    from verbmirage.conditions import ImageResolver, apply_condition
    from verbmirage.inference import predict
    from verbmirage.io import PREDICTIONS, write_table
    from verbmirage.questions import QuestionSettings, build_question_set

    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(6)
    apply_condition(demo_roots[0], sorted(set(questions.image)), tmp_path / "clean", "clean", {"type": "clean"})
    predictions = predict(questions, model, ImageResolver(tmp_path / "clean"), batch_size=4)
    assert (predictions.prediction == "yes").all()
    write_table(predictions, tmp_path / "p.parquet", PREDICTIONS, provenance={"settings": {"api_key_env": "VM_TEST_KEY"}})
    assert KEY.encode() not in (tmp_path / "p.parquet").read_bytes()
