"""OpenAI-compatible chat-completions backend (GPT-4-class models, Gemini's
OpenAI endpoint, a vLLM or SGLang server).

The image goes as a base64 data URL. The answer (``prediction``) is always the
parse of the text the server returns, as decoded at the configured temperature
(``parse_rule`` "greedy:..." at temperature 0, else "sample:...", with a "text:" prefix where the
server sent no logprobs, so the probabilities are only the parsed answer's 0/1); ``confidence``
is the probability of that text's first token. The scores come from the first
answer token's ``top_logprobs`` when the server returns them (P(yes) = yes mass
over yes+no mass; ``yes_margin`` = logsumexp of the yes logprobs minus that of the
no logprobs, when both words are among the top logprobs; MC = renormalised mass of
the option letters); otherwise the probability is 1 for the parsed answer.

Requests run concurrently (``max_concurrency``) and are retried with
exponential backoff on 408, 409, 429, 5xx, timeouts and dropped connections
(``Retry-After`` is honoured). How a failure ends (the contract of
:mod:`verbmirage.models.base`):

- 401/403: :class:`~verbmirage.models.base.FatalBackendError`; no question
  can succeed with a rejected key, so the job stops at once.
- retries used up: an error result with ``retry=True``, not stored, so a
  resumed job asks again.
- anything else (a 400 for that question, an unreadable image, a 200 whose
  body is not a chat completion): an error result with ``retry=False``.

The key is read from the environment variable named by ``api_key_env``
(which must end in ``_API_KEY``, so a config cannot send some other secret)
and is sent in the Authorization header and nowhere else: response bodies
are scrubbed before they are cut short, exceptions from ``requests`` are
reported by type and host only (their text can quote the header), and
settings and artifacts only hold the variable's name. Plain ``http://`` is
allowed to loopback only (:func:`check_endpoint`).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import math
import mimetypes
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import requests

from verbmirage.models.base import (
    NO,
    YES,
    FatalBackendError,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    option_letter,
    yes_no_margin,
)
from verbmirage.models.parsing import letter_token, parse_choice, parse_yes_no, yes_no_token
from verbmirage.models.prompts import PromptTemplate
from verbmirage.models.registry import API

log = logging.getLogger(__name__)
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
FATAL_STATUS = frozenset({401, 403})
#: How much of a response body goes into an error message (after scrubbing).
BODY_CHARS = 200
#: Env var names a config may point the key at; anything else could be another secret.
KEY_ENV_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]*_API_KEY")


class ApiError(RuntimeError):
    """A question failed: ``retry`` says whether asking again later may fix it (retries used up)."""

    def __init__(self, message: str, retry: bool = False):
        super().__init__(message)
        self.retry = retry


class MalformedResponse(ValueError):
    """A 200 response that is not a chat completion we can read."""


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(where: str, base_url: str, api_key_env: str) -> None:
    """Refuse settings that would send a key somewhere unsafe (``where`` is e.g. ``"models.gpt4"``).

    ``api_key_env`` must end in ``_API_KEY``: otherwise a shared config could
    send any secret of the user's environment to its server. ``base_url``
    must be https, or plain http to loopback (a local vLLM server), and must
    not hold credentials of its own. Pure and cheap, so config checks call it too.
    """
    if not isinstance(api_key_env, str) or not KEY_ENV_PATTERN.fullmatch(api_key_env):
        raise ValueError(
            f"{where}.api_key_env: {api_key_env!r} is not allowed; name an environment variable that ends in "
            f"_API_KEY (letters, digits, underscores), e.g. OPENAI_API_KEY"
        )
    if not isinstance(base_url, str):
        raise ValueError(f"{where}.base_url: must be a URL string, got {type(base_url).__name__}")
    parts = urlsplit(base_url)
    try:
        host, _ = parts.hostname, parts.port
    except ValueError as error:
        raise ValueError(f"{where}.base_url: {base_url!r} is not a valid URL ({error})") from None
    if parts.scheme not in ("https", "http") or not host:
        raise ValueError(f"{where}.base_url: {base_url!r} must be an https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"{where}.base_url: must not contain credentials (user:password@); the key goes in "
                         f"{api_key_env}")
    if parts.scheme == "http" and not _is_loopback(host):
        raise ValueError(
            f"{where}.base_url: plain http:// would send the key unencrypted to {host}; use https:// "
            f"(http is allowed only to localhost, 127.0.0.0/8 and ::1)"
        )


def _read_key(where: str, api_key_env: str) -> str:
    """The key from the environment, refused (never echoed) if it has whitespace or control characters.

    A trailing newline from ``echo key > file`` would make ``requests`` raise
    an error that quotes the whole header; stripping it silently would hide a
    broken variable, so the user is told to fix it.
    """
    key = os.environ.get(api_key_env)
    if not key:
        raise ValueError(f"{where}.api_key_env: environment variable {api_key_env} is not set")
    if not all(33 <= ord(char) <= 126 for char in key):
        raise ValueError(
            f"{where}.api_key_env: the value of environment variable {api_key_env} contains whitespace, "
            f"control or non-ASCII characters (a trailing newline?); set it to the bare key"
        )
    return key


def image_data_url(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


def _logprob(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value == math.inf:
        raise MalformedResponse(f"{where} is {value!r}, not a log-probability")
    return float(value)


def read_completion(body) -> tuple[str, list[tuple[str, float]], float | None]:
    """The answer text, the first answer token's ``(token, logprob)`` candidates, and that token's own
    log-probability (None without logprobs) of a chat completion.

    Raises :class:`MalformedResponse` naming the part that is missing or of the
    wrong type (an ``{"error": ...}`` body, no choices, no message, a logprob
    that is not a number), so each such answer becomes an error row.
    """
    if not isinstance(body, dict):
        raise MalformedResponse(f"body is a JSON {type(body).__name__}, not an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse("an error object instead of choices" if "error" in body else "no choices")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise MalformedResponse("choices[0] has no message object")
    text = message.get("content")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise MalformedResponse(f"choices[0].message.content is a {type(text).__name__}, not text")
    logprobs = choice.get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content:
        return text, [], None
    first = content[0] if isinstance(content, list) else None
    if not isinstance(first, dict):
        raise MalformedResponse("choices[0].logprobs.content[0] is not an object")
    chosen = first.get("logprob")
    chosen = None if chosen is None else _logprob(chosen, "choices[0].logprobs.content[0].logprob")
    candidates = first.get("top_logprobs") or [{"token": first.get("token"), "logprob": first.get("logprob")}]
    read = []
    for i, candidate in enumerate(candidates if isinstance(candidates, list) else [None]):
        where = f"choices[0].logprobs.content[0].top_logprobs[{i}]"
        if not isinstance(candidate, dict) or not isinstance(candidate.get("token"), str):
            raise MalformedResponse(f"{where} has no token")
        read.append((candidate["token"], _logprob(candidate.get("logprob"), f"{where}.logprob")))
    if chosen is None and read:
        chosen = max(logprob for _, logprob in read)
    return text, read, chosen


class OpenAIChatModel(VisionLanguageModel):
    """An OpenAI-compatible chat API (GPT-4 class, Gemini's compatible endpoint, a vLLM server), image inline."""

    backend = "openai"
    variant_features = API

    def __init__(
        self,
        name: str,
        model: str,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str = DEFAULT_API_KEY_ENV,
        max_concurrency: int = 4,
        max_retries: int = 5,
        timeout: float = 60.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        max_tokens: int = 8,
        temperature: float = 0.0,
        top_logprobs: int = 20,
        logprobs: bool = True,
        prompts: dict | None = None,
    ):
        super().__init__(name)
        check_endpoint(f"models.{name}", base_url, api_key_env)
        self._key, self.api_key_env = _read_key(f"models.{name}", api_key_env), api_key_env
        self.model, self.url = model, base_url.rstrip("/") + "/chat/completions"
        self.host = urlsplit(self.url).netloc
        log.info("%s: sending questions to %s (key from $%s)", name, self.host, api_key_env)
        self.max_concurrency, self.max_retries = max_concurrency, max_retries
        self.timeout, self.backoff, self.max_backoff = timeout, backoff, max_backoff
        self.max_tokens, self.temperature = max_tokens, temperature
        self.logprobs, self.top_logprobs = logprobs, top_logprobs
        self.prompts = PromptTemplate.from_config(prompts, where=f"models.{name}.prompts")
        self._session = requests.Session()

    def __repr__(self) -> str:  # never show the key
        return f"OpenAIChatModel(name={self.name!r}, model={self.model!r}, url={self.url!r})"

    # ---- HTTP ---------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        """Remove the key, also as a repr or a JSON string would quote it (defence in depth)."""
        forms = {self._key, repr(self._key)[1:-1], json.dumps(self._key)[1:-1], self._key.strip()}
        for form in sorted(filter(None, forms), key=len, reverse=True):
            text = text.replace(form, "***")
        return text

    def _body(self, text: str) -> str:
        """A short, scrubbed excerpt of a response body: scrub first, so a cut cannot split the key."""
        return self._scrub(text)[:BODY_CHARS]

    def _payload(self, question: Question, kind: str) -> dict:
        """``kind``: "yn" and "mc" wrap the question in the prompt template, "free" sends it as is."""
        text = question.prompt if kind == "free" else self.prompts.render(question.prompt, kind == "mc")
        content = [{"type": "text", "text": text}]
        if question.image is not None:
            content.append({"type": "image_url", "image_url": {"url": image_data_url(question.image)}})
        payload = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.logprobs:
            payload.update(logprobs=True, top_logprobs=self.top_logprobs)
        return payload

    def _post(self, payload: dict, stop: threading.Event | None = None) -> dict:
        """POST with retries; returns the decoded body, or raises :class:`ApiError` / ``FatalBackendError``.

        Exceptions from ``requests`` are reported by type name and host only:
        their text can quote the Authorization header.
        """
        headers = {"Authorization": f"Bearer {self._key}"}
        problem = ""
        for attempt in range(self.max_retries + 1):
            if stop is not None and stop.is_set():
                raise ApiError(f"not asked: the batch stopped ({problem or 'another question failed fatally'})",
                               retry=True)
            wait = min(self.max_backoff, self.backoff * 2**attempt)
            try:
                response = self._session.post(self.url, json=payload, headers=headers, timeout=self.timeout)
            except (requests.Timeout, requests.ConnectionError, requests.exceptions.ChunkedEncodingError) as error:
                problem = f"{type(error).__name__} (request to {self.host})"
            except requests.RequestException as error:
                raise ApiError(f"{type(error).__name__} (request to {self.host})") from None
            else:
                status = response.status_code
                if status == 200:
                    try:
                        return response.json()
                    except ValueError:
                        raise MalformedResponse(f"HTTP 200, body is not JSON: {self._body(response.text)}") from None
                problem = f"HTTP {status}: {self._body(response.text)}"
                if status in FATAL_STATUS:
                    raise FatalBackendError(
                        f"{self.name}: {self.host} refused the request ({problem}); check the key in "
                        f"${self.api_key_env} and its access to model {self.model!r}"
                    )
                if status not in RETRY_STATUS:
                    raise ApiError(problem)
                retry_after = response.headers.get("Retry-After")
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    wait = min(self.max_backoff, float(retry_after))
            if attempt < self.max_retries:
                log.warning("%s: %s; retry %d/%d in %.1fs", self.name, problem, attempt + 1, self.max_retries, wait)
                time.sleep(wait)
        raise ApiError(f"gave up after {self.max_retries + 1} attempts: {problem}", retry=True)

    def _ask_all(self, questions: list[Question], kind: str, max_tokens: int | None = None) -> list:
        """One decoded body (or the :class:`ApiError` that ended it) per question, in order.

        A ``FatalBackendError`` on any question stops the others from being
        asked (or retried) and is raised once the running requests are back.
        """
        stop = threading.Event()

        def ask(question: Question):
            if stop.is_set():
                return None
            try:
                payload = self._payload(question, kind)
            except (OSError, ValueError) as error:  # e.g. an unreadable image: this question only
                return ApiError(self._scrub(f"{type(error).__name__}: {error}"))
            if max_tokens is not None:
                payload["max_tokens"] = max_tokens
            try:
                return self._post(payload, stop)
            except FatalBackendError as error:
                stop.set()
                return error
            except (ApiError, MalformedResponse) as error:
                return ApiError(self._scrub(str(error)), retry=getattr(error, "retry", False))

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            answers = list(pool.map(ask, questions))
        fatal = next((a for a in answers if isinstance(a, FatalBackendError)), None)
        if fatal is not None:
            raise fatal
        return answers

    # ---- reading answers ----------------------------------------------------
    def _answers(self, questions: list[Question], kind: str, max_tokens: int | None = None) -> list:
        """Per question, ``(text, first-token candidates)`` or the :class:`ApiError` that ended it.

        A 200 body that is not a readable completion is that question's error
        (with a scrubbed excerpt), never a crash of the batch.
        """
        answers = []
        for body in self._ask_all(questions, kind, max_tokens):
            if isinstance(body, ApiError):
                answers.append(body)
                continue
            try:
                answers.append(read_completion(body))
            except MalformedResponse as error:
                excerpt = self._body(json.dumps(body, ensure_ascii=False, default=str))
                answers.append(ApiError(f"HTTP 200, malformed response ({self._scrub(str(error))}): {excerpt}"))
        return answers

    def _decoding(self) -> str:
        return "greedy" if self.temperature == 0 else "sample"

    def _score_yes_no(self, questions):
        results = []
        for answer in self._answers(questions, "yn"):
            if isinstance(answer, ApiError):
                results.append(YesNoResult.failed(str(answer), retry=answer.retry))
                continue
            text, candidates, chosen = answer
            prediction, rule = parse_yes_no(text)
            confidence = math.exp(chosen) if chosen is not None else math.nan
            mass = {YES: 0.0, NO: 0.0}
            logprobs = {YES: [], NO: []}
            for token, logprob in candidates:
                word = yes_no_token(token)
                if word is not None:
                    mass[word] += math.exp(logprob)
                    logprobs[word].append(logprob)
            rule = f"{self._decoding()}:{rule}"
            yes_mass = mass[YES] if candidates else None  # the yes tokens among the top logprobs only
            if mass[YES] + mass[NO] > 0:
                p_yes = mass[YES] / (mass[YES] + mass[NO])
                # only where both words are among the top logprobs; one side missing gives a bound, not a score
                margin = yes_no_margin(logprobs[YES], logprobs[NO])
            else:  # no scores: P(yes) is the parsed answer's 0/1, marked "text:" (ensembles.graded)
                p_yes, margin, rule = {YES: 1.0, NO: 0.0}.get(prediction, math.nan), None, f"text:{rule}"
            results.append(YesNoResult(p_yes, prediction, text, confidence, rule, yes_margin=margin,
                                       yes_mass=yes_mass))
        return results

    def _score_multiple_choice(self, questions):
        results = []
        for question, answer in zip(questions, self._answers(questions, "mc")):
            n = len(question.options)
            if isinstance(answer, ApiError):
                results.append(MultipleChoiceResult.failed(n, str(answer), retry=answer.retry))
                continue
            text, candidates, chosen = answer
            letter, rule = parse_choice(text, question.options)
            confidence = math.exp(chosen) if chosen is not None else math.nan
            mass = [0.0] * n
            for token, logprob in candidates:
                candidate = letter_token(token, n)
                if candidate is not None and token.strip() == candidate:
                    mass[ord(candidate) - ord("A")] += math.exp(logprob)
            total, rule = sum(mass), f"{self._decoding()}:{rule}"
            if total > 0:
                probs = tuple(m / total for m in mass)
            else:  # no scores: the parsed letter's 0/1, marked "text:" (ensembles.graded)
                probs, rule = tuple(1.0 if letter == option_letter(i) else 0.0 for i in range(n)), f"text:{rule}"
            results.append(MultipleChoiceResult(probs, letter, text, confidence, rule))
        return results

    def _generate(self, questions, max_new_tokens):
        texts = []
        for question, answer in zip(questions, self._answers(questions, "free", max_tokens=max_new_tokens)):
            if isinstance(answer, ApiError):
                log.warning("%s: question %s: %s", self.name, question.question_id, answer)
                texts.append("")
            else:
                texts.append(answer[0])
        return texts
