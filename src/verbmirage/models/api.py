"""OpenAI-compatible chat-completions backend (GPT-4-class models, Gemini's
OpenAI endpoint, a vLLM or SGLang server).

The image goes as a base64 data URL. Answer probabilities come from the
first answer token's ``top_logprobs`` when the server returns them (P(yes) =
yes mass over yes+no mass; MC = renormalised mass of the option letters);
otherwise the text is parsed and the probability is 1 for the parsed answer.

Requests run concurrently (``max_concurrency``) and are retried with
exponential backoff on 429, 5xx, timeouts and dropped connections
(``Retry-After`` is honoured). The key is read from the environment variable
named by ``api_key_env``; it is sent in the Authorization header and nowhere
else: error messages are scrubbed of it, and settings and artifacts only
hold the variable's name.
"""

from __future__ import annotations

import base64
import logging
import math
import mimetypes
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from verbmirage.models.base import (
    NO,
    YES,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    option_letter,
)
from verbmirage.models.parsing import letter_token, normalise_token, parse_choice, parse_yes_no
from verbmirage.models.prompts import PromptTemplate

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ApiError(RuntimeError):
    """A request failed for good (after retries, or with a status that retrying cannot fix)."""


def image_data_url(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(Path(path).read_bytes()).decode()}"


class OpenAIChatModel(VisionLanguageModel):
    backend = "openai"

    def __init__(
        self,
        name: str,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str = "OPENAI_API_KEY",
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
        key = os.environ.get(api_key_env)
        if not key:
            raise ValueError(f"models.{name}.api_key_env: environment variable {api_key_env} is not set")
        self._key = key
        self.model, self.url = model, base_url.rstrip("/") + "/chat/completions"
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
        return text.replace(self._key, "***")

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

    def _post(self, payload: dict) -> dict:
        """POST with retries; returns the decoded response or raises :class:`ApiError`."""
        headers = {"Authorization": f"Bearer {self._key}"}
        problem = ""
        for attempt in range(self.max_retries + 1):
            wait = min(self.max_backoff, self.backoff * 2**attempt)
            try:
                response = self._session.post(self.url, json=payload, headers=headers, timeout=self.timeout)
            except (requests.Timeout, requests.ConnectionError) as error:
                problem = f"{type(error).__name__}"
            else:
                if response.status_code == 200:
                    return response.json()
                problem = f"HTTP {response.status_code}: {self._scrub(response.text[:200])}"
                if response.status_code not in RETRY_STATUS:
                    raise ApiError(problem)
                retry_after = response.headers.get("Retry-After")
                if retry_after and retry_after.replace(".", "", 1).isdigit():
                    wait = min(self.max_backoff, float(retry_after))
            if attempt < self.max_retries:
                log.warning("%s: %s; retry %d/%d in %.1fs", self.name, problem, attempt + 1, self.max_retries, wait)
                time.sleep(wait)
        raise ApiError(f"gave up after {self.max_retries + 1} attempts: {problem}")

    def _ask_all(self, questions: list[Question], kind: str, max_tokens: int | None = None) -> list:
        """One response (or the exception that ended its retries) per question, in order."""

        def ask(question: Question):
            try:
                payload = self._payload(question, kind)
                if max_tokens is not None:
                    payload["max_tokens"] = max_tokens
                return self._post(payload)
            except (ApiError, OSError, ValueError) as error:
                return ApiError(self._scrub(str(error)))

        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(ask, questions))

    # ---- reading answers ----------------------------------------------------
    @staticmethod
    def _first_token_logprobs(response: dict) -> list[tuple[str, float]]:
        choice = response["choices"][0]
        content = ((choice.get("logprobs") or {}).get("content")) or []
        if not content:
            return []
        first = content[0]
        candidates = first.get("top_logprobs") or [{"token": first["token"], "logprob": first["logprob"]}]
        return [(c["token"], float(c["logprob"])) for c in candidates]

    @staticmethod
    def _text(response: dict) -> str:
        return response["choices"][0]["message"].get("content") or ""

    def _score_yes_no(self, questions):
        results = []
        for response in self._ask_all(questions, "yn"):
            if isinstance(response, Exception):
                results.append(YesNoResult.failed(str(response)))
                continue
            text, candidates = self._text(response), self._first_token_logprobs(response)
            mass = {YES: 0.0, NO: 0.0}
            for token, logprob in candidates:
                word = normalise_token(token)
                if word in mass:
                    mass[word] += math.exp(logprob)
            confidence = math.exp(max(lp for _, lp in candidates)) if candidates else math.nan
            if mass[YES] + mass[NO] > 0:
                p_yes = mass[YES] / (mass[YES] + mass[NO])
                results.append(YesNoResult(p_yes, YES if p_yes >= 0.5 else NO, text, confidence, "logprobs"))
            else:
                answer, rule = parse_yes_no(text)
                p_yes = {YES: 1.0, NO: 0.0}.get(answer, math.nan)
                results.append(YesNoResult(p_yes, answer, text, confidence, f"text:{rule}"))
        return results

    def _score_multiple_choice(self, questions):
        results = []
        for question, response in zip(questions, self._ask_all(questions, "mc")):
            n = len(question.options)
            if isinstance(response, Exception):
                results.append(MultipleChoiceResult.failed(n, str(response)))
                continue
            text, candidates = self._text(response), self._first_token_logprobs(response)
            mass = [0.0] * n
            for token, logprob in candidates:
                letter = letter_token(token, n)
                if letter is not None:
                    mass[ord(letter) - ord("A")] += math.exp(logprob)
            confidence = math.exp(max(lp for _, lp in candidates)) if candidates else math.nan
            total = sum(mass)
            if total > 0:
                probs = tuple(m / total for m in mass)
                best = max(range(n), key=probs.__getitem__)
                results.append(MultipleChoiceResult(probs, option_letter(best), text, confidence, "logprobs"))
            else:
                letter, rule = parse_choice(text, question.options)
                probs = tuple(1.0 if letter == option_letter(i) else 0.0 for i in range(n))
                results.append(MultipleChoiceResult(probs, letter, text, confidence, f"text:{rule}"))
        return results

    def _generate(self, questions, max_new_tokens):
        texts = []
        for response in self._ask_all(questions, "free", max_tokens=max_new_tokens):
            texts.append("" if isinstance(response, Exception) else self._text(response))
        return texts
