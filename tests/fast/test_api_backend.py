"""The OpenAI-compatible backend against a real HTTP server on loopback."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from PIL import Image

from verbmirage.models import Question, create_model
from verbmirage.models.api import check_endpoint
from verbmirage.models.base import FatalBackendError

KEY = "sk-test-very-secret-0123456789"
#: An error body whose key starts just before the 200-character cut.
STRADDLING = "x" * 195 + KEY + " tail"


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
        if question.startswith("echo"):
            return 400, {}, STRADDLING, 0
        if question.startswith("unauthorized"):
            return 401, {}, {"error": {"message": f"Incorrect API key provided: Bearer {KEY}"}}, 0
        if question.startswith("forbidden"):
            return 403, {}, {"error": {"message": "no access to this model"}}, 0
        if question.startswith("dropped"):
            return None, {}, "", 0
        if question.startswith("error body"):
            return 200, {}, {"error": {"message": "quota exceeded", "type": "insufficient_quota"}}, 0
        if question.startswith("empty choices"):
            return 200, {}, {"id": "x", "choices": []}, 0
        if question.startswith("no message"):
            return 200, {}, {"id": "x", "choices": [{"index": 0, "finish_reason": "stop"}]}, 0
        if question.startswith("bad logprob"):
            return 200, {}, _completion("Yes", [(" Yes", "abc"), (" No", -2.5)]), 0
        if question.startswith("not json"):
            return 200, {}, "<html>gateway busy, try later</html>", 0
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
            if status is None:  # drop the connection without an answer
                self.close_connection = True
                return
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
    monkeypatch.setenv("VM_TEST_API_KEY", KEY)
    return create_model("api", _settings(url))


def _settings(url: str, **changes) -> dict:
    settings = {"backend": "openai", "model": "gpt-test", "base_url": url, "api_key_env": "VM_TEST_API_KEY",
                "max_concurrency": 2, "max_retries": 2, "timeout": 0.5, "backoff": 0.01}
    return {**settings, **changes}


def _host(server) -> str:
    return urlsplit(server[0]).netloc


def _image(tmp_path):
    image = tmp_path / "img.jpg"
    Image.new("RGB", (8, 8)).save(image)
    return image


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
    assert results["plain"].parse_rule == "greedy:first-word" and results["plain"].prediction == "yes"
    for name in ("rate limited", "flaky", "slow"):
        assert results[name].prediction == "yes" and results[name].error is None, name
    assert results["text only"].prediction == "no" and results["text only"].p_yes == 0.0
    assert results["text only"].parse_rule == "text:greedy:first-word"
    assert results["broken"].error and "gave up after 3 attempts" in results["broken"].error
    assert results["broken"].retry is True  # 503 until retries ran out: transient, asked again on resume
    assert results["invalid"].error.startswith("HTTP 400") and results["invalid"].retry is False
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
    monkeypatch.delenv("NOT_SET_API_KEY", raising=False)
    with pytest.raises(ValueError, match="models.api.api_key_env: environment variable NOT_SET_API_KEY is not set"):
        create_model("api", {"backend": "openai", "model": "m", "api_key_env": "NOT_SET_API_KEY"})


def test_key_not_in_written_predictions(model, tmp_path, demo_anno, demo_roots):
    from verbmirage.benchmark.conditions import ImageResolver, apply_condition
    from verbmirage.inference.runs import predict
    from verbmirage.core.io import write_table
    from verbmirage.core.schemas import PREDICTIONS
    from verbmirage.benchmark.questions import QuestionSettings, build_question_set

    questions = build_question_set(demo_anno, "yn_obj", QuestionSettings()).head(6)
    apply_condition(demo_roots[0], sorted(set(questions.image)), tmp_path / "clean", "clean", {"type": "clean"})
    predictions = predict(questions, model, ImageResolver(tmp_path / "clean"), batch_size=4)
    assert (predictions.prediction == "yes").all()
    write_table(predictions, tmp_path / "p.parquet", PREDICTIONS, provenance={"settings": {"api_key_env": "VM_TEST_API_KEY"}})
    assert KEY.encode() not in (tmp_path / "p.parquet").read_bytes()


# ---- fail loudly, never leak the key --------------------------------------------------------------


@pytest.mark.parametrize("bad_key", [KEY + "\n", " " + KEY, KEY[:10] + "\x7f" + KEY[10:], KEY + "é"])
def test_key_with_whitespace_or_control_chars_is_refused_without_echoing_it(server, monkeypatch, bad_key):
    """Probe 6b: a trailing newline made requests quote the whole key into every error cell."""
    url, behaviour = server
    monkeypatch.setenv("VM_TEST_API_KEY", bad_key)
    with pytest.raises(ValueError, match="environment variable VM_TEST_API_KEY contains whitespace") as caught:
        create_model("api", _settings(url))
    assert KEY[:10] not in str(caught.value) and not behaviour.attempts


def test_request_exception_text_never_reaches_the_error_column(model, server, tmp_path):
    """Defence in depth: requests' InvalidHeader quotes the header; only its type and host are kept."""
    model._key = KEY + "\n"  # what the init check now refuses; the request layer must not leak it either
    result = model.score_yes_no([Question("q", "plain question?", image=_image(tmp_path))])[0]
    assert KEY not in repr(result) and KEY[:10] not in repr(result)
    assert result.error == f"InvalidHeader (request to {_host(server)})" and result.retry is False


def test_key_straddling_the_cut_of_an_echoed_body_never_leaks(model, tmp_path, caplog):
    """Probe 6a: cutting the body to 200 characters before scrubbing left the key's first characters."""
    caplog.set_level(logging.DEBUG)
    result = model.score_yes_no([Question("q", "echo question?", image=_image(tmp_path))])[0]
    assert result.error.startswith("HTTP 400: " + "x" * 195 + "***")
    assert KEY[:5] not in result.error and len(result.error) <= len("HTTP 400: ") + 200
    assert all(KEY[:5] not in record.getMessage() for record in caplog.records)


def test_401_raises_fatal_error_and_stops_asking(model, server, tmp_path):
    """Probe 12: a rejected key gave 1185 error rows and exit 0; now the job stops at the first 401."""
    _, behaviour = server
    image = _image(tmp_path)
    questions = [Question(f"q{i}", f"unauthorized question {i}?", image=image) for i in range(8)]
    with pytest.raises(FatalBackendError, match="HTTP 401") as caught:
        model.score_yes_no(questions)
    assert KEY not in str(caught.value) and "***" in str(caught.value)
    assert sum(behaviour.attempts.values()) <= 4  # concurrency 2: the rest of the batch is never sent


def test_403_is_fatal_for_multiple_choice_and_free_text(model, tmp_path):
    image = _image(tmp_path)
    mc = Question("m", "forbidden: Which?\nA. a\nB. b", image=image, options=("a", "b"))
    with pytest.raises(FatalBackendError, match="HTTP 403"):
        model.score_multiple_choice([mc])
    with pytest.raises(FatalBackendError, match="HTTP 403"):
        model.generate([Question("g", "forbidden: describe the image", image=image)])


def test_dropped_connections_become_transient_rows_named_by_type_and_host(model, server, tmp_path):
    _, behaviour = server
    result = model.score_yes_no([Question("q", "dropped question?", image=_image(tmp_path))])[0]
    assert result.retry is True and result.prediction == "unknown"
    assert result.error == f"gave up after 3 attempts: ConnectionError (request to {_host(server)})"
    assert list(behaviour.attempts.values()) == [3]


def test_malformed_200_bodies_become_error_rows_and_the_batch_goes_on(model, tmp_path):
    """Probe 13: KeyError/IndexError/ValueError on a 200 body crashed the whole batch."""
    image = _image(tmp_path)
    names = ["plain", "error body", "empty choices", "no message", "bad logprob", "not json", "text only"]
    questions = [Question(f"q{i}", f"{name} question?", image=image) for i, name in enumerate(names)]
    results = dict(zip(names, model.score_yes_no(questions)))
    assert results["plain"].prediction == "yes" and results["text only"].prediction == "no"
    expected = {
        "error body": "an error object instead of choices",
        "empty choices": "no choices",
        "no message": "choices[0] has no message object",
        "bad logprob": "logprob is 'abc', not a log-probability",
        "not json": "body is not JSON: <html>gateway busy, try later</html>",
    }
    for name, reason in expected.items():
        result = results[name]
        assert result.error.startswith("HTTP 200") and reason in result.error, (name, result.error)
        assert result.retry is False and result.parse_rule == "error" and math.isnan(result.p_yes)
    assert "quota exceeded" in results["error body"].error  # the short body says why


def test_malformed_200_in_multiple_choice_and_generate(model, tmp_path):
    image = _image(tmp_path)
    good = Question("m1", "Which of the following?\nA. a\nB. b", image=image, options=("a", "b"))
    bad = Question("m2", "empty choices: Which?\nA. a\nB. b", image=image, options=("a", "b"))
    results = model.score_multiple_choice([good, bad])
    assert results[0].prediction == "B" and results[0].error is None
    assert "no choices" in results[1].error and len(results[1].option_probs) == 2
    texts = model.generate([Question("g1", "not json please", image=image), Question("g2", "plain", image=image)])
    assert texts == ["", "Yes"]


@pytest.mark.parametrize("api_key_env", ["SOME_CLOUD_TOKEN", "AWS_SECRET_ACCESS_KEY", "_API_KEY", "OPENAI_API_KEY\n",
                                         "X-API_KEY", None])
def test_check_endpoint_refuses_key_variables_not_named_api_key(api_key_env):
    with pytest.raises(ValueError, match=r"^models\.gpt4\.api_key_env: .*_API_KEY"):
        check_endpoint("models.gpt4", "https://api.openai.com/v1", api_key_env)


@pytest.mark.parametrize("base_url", ["http://example.org/v1", "http://10.0.0.1:8000/v1", "http://127.0.0.1.nip.io/v1",
                                      "http://localhost.example.org/v1", "ftp://127.0.0.1/v1", "api.openai.com/v1",
                                      "https://user:secret@api.openai.com/v1", "https://api.openai.com:port/v1", 42])
def test_check_endpoint_refuses_unsafe_urls(base_url):
    with pytest.raises(ValueError, match=r"^models\.gpt4\.base_url: "):
        check_endpoint("models.gpt4", base_url, "OPENAI_API_KEY")


@pytest.mark.parametrize("base_url", ["https://api.openai.com/v1", "http://127.0.0.1:8000/v1", "http://127.5.6.7/v1",
                                      "http://localhost:8000/v1", "HTTP://LOCALHOST/v1", "http://[::1]:8000/v1"])
def test_check_endpoint_allows_https_and_loopback_http(base_url):
    check_endpoint("models.gpt4", base_url, "GEMINI_API_KEY")


def test_backend_refuses_other_secrets_before_sending_anything(server, monkeypatch):
    """Probe 7: `api_key_env: SOME_CLOUD_TOKEN` sent that secret to the configured server."""
    url, behaviour = server
    monkeypatch.setenv("SOME_CLOUD_TOKEN", KEY)
    with pytest.raises(ValueError, match="models.api.api_key_env: 'SOME_CLOUD_TOKEN' is not allowed"):
        create_model("api", _settings(url, api_key_env="SOME_CLOUD_TOKEN"))
    monkeypatch.setenv("VM_TEST_API_KEY", KEY)
    with pytest.raises(ValueError, match="models.api.base_url: plain http:// would send the key unencrypted"):
        create_model("api", _settings("http://example.org/v1"))
    assert not behaviour.auth


def test_host_is_logged_once_at_start(server, monkeypatch, caplog):
    url, _ = server
    monkeypatch.setenv("VM_TEST_API_KEY", KEY)
    caplog.set_level(logging.INFO, logger="verbmirage.models.api")
    create_model("api", _settings(url))
    lines = [r.getMessage() for r in caplog.records if _host(server) in r.getMessage()]
    assert lines == [f"api: sending questions to {_host(server)} (key from $VM_TEST_API_KEY)"]
