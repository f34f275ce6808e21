"""Adapters for checkpoints that run their own code (``trust_remote_code``).

Qwen-VL-Chat, Molmo-7B-D, MiniCPM-Llama3-V-2.5 and mPLUG-Owl2 were written
for old transformers/torch releases. Each checkpoint's calling convention
lives in one *driver* (:mod:`verbmirage.models.remote_worker`); an adapter
here runs that driver either

- **in a worker process** in the model's own environment (entry key
  ``python: /path/to/bin/python`` or ``env: <name>``, an environment built by
  ``tools/make_envs.sh`` under ``.envs/<name>``), speaking a JSON line
  protocol, so the job stays on the project's pins; or
- **in-process** (no such key), with the driver's load-time patches for
  transformers 5.x.

Either way YN and MC are scored from the logits at the first answer position
(P(yes) = yes mass / (yes + no mass); ``yes_margin`` = logsumexp(yes logits) -
logsumexp(no logits) in float64; ``confidence`` = the probability of the first
answer token: the argmax, or under beam search and sampling the first token the checkpoint's ``generate``
returned, an end token too, in the first position's softmax; that is the distribution ``generate`` draws from
at the paper's sampling settings, T = 1 without top-k or top-p, while a variant that warps it keeps the unwarped
probability, docs/models.md) and decided like the transformers backends, by the same function
(:mod:`verbmirage.models.answers`): the first (argmax) token when it is yes/no or
an option letter, else the parse of the greedy continuation. With ``scoring: text`` the answer is the
checkpoint's own decoding (e.g. MiniCPM's beam 3 with repetition penalty 1.2),
named in ``parse_rule``.

``trust_remote_code: true`` must be written in the model's own config entry:
it runs Python shipped with the checkpoint, so it is never a global default.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import queue
import subprocess
import threading
from pathlib import Path

import numpy as np

from verbmirage.core.imaging import open_rgb
from verbmirage.models import answers, remote_driver, remote_worker
from verbmirage.models.base import (
    NO,
    UNKNOWN,
    YES,
    FatalBackendError,
    MultipleChoiceResult,
    Question,
    VisionLanguageModel,
    YesNoResult,
    allow_remote_code,
    option_letter,
    yes_no_margin,
)
from verbmirage.models.hf.tokens import answer_token_ids
from verbmirage.models.memory import MemoryCosts, remote_memory_costs
from verbmirage.models.parsing import decide_choice, parse_choice, parse_yes_no, yes_no_token
from verbmirage.models.prompts import PromptTemplate
from verbmirage.models.registry import REMOTE, REMOTE_NO_BEAM
from verbmirage.variants.settings import question_seed

WORKER_SCRIPT = Path(remote_worker.__file__).resolve()


def driver_code_digest() -> str:
    """sha256 of the files a worker runs (``remote_worker.FILES``: the worker, the driver base, the drivers)."""
    digest = hashlib.sha256()
    for name in remote_worker.FILES:
        digest.update((Path(remote_worker.__file__).resolve().parent / name).read_bytes())
    return digest.hexdigest()

#: Where ``env: <name>`` entries are looked up (``tools/make_envs.sh`` builds them there).
ENVS_DIR_VARIABLE = "VERBMIRAGE_ENVS_DIR"
#: What ``configs/paper.yaml`` writes where a hub commit must be filled in; refused until replaced.
STDERR_TAIL = 40


class WorkerError(FatalBackendError):
    """The worker process died, timed out or could not load its model: no question can be answered."""


class WorkerClient:
    """A driver in a worker process started with another interpreter (the model's environment).

    Requests and replies are JSON lines; stderr is kept (last lines) for error
    messages. A crash, a timeout or a broken reply raises :class:`WorkerError`
    naming the model and the worker's last stderr lines; a failed request
    (``ok: false``) is returned to the caller, and the worker keeps serving.
    """

    def __init__(self, python: str | Path, where: str, timeout: float = 600.0, env: dict | None = None):
        self.where, self.timeout = where, timeout
        self.python = str(python)
        self._stderr = collections.deque(maxlen=STDERR_TAIL)
        self._replies: queue.Queue = queue.Queue()
        try:
            self.process = subprocess.Popen(
                [self.python, "-u", str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, encoding="utf-8", bufsize=1,
                env={**os.environ, "PYTHONNOUSERSITE": "1", **(env or {})},
            )
        except OSError as error:
            raise WorkerError(f"{where}: cannot start the worker with {self.python}: {error}") from error
        threading.Thread(target=self._pump, args=(self.process.stdout, self._replies.put, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.process.stderr, self._stderr.append, False), daemon=True).start()

    @staticmethod
    def _pump(stream, sink, mark_end: bool) -> None:
        """Copy lines of a pipe into ``sink``; ``None`` marks the end of the replies (the worker exited)."""
        for line in stream:
            sink(line.rstrip("\n"))
        if mark_end:
            sink(None)

    def stderr_tail(self, lines: int = 15) -> str:
        return "\n".join(list(self._stderr)[-lines:])

    def _fail(self, what: str) -> WorkerError:
        self.close(kill=True)
        return WorkerError(f"{self.where}: the worker ({self.python}) {what}; its last stderr lines:\n"
                           f"{self.stderr_tail() or '(none)'}")

    def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send one request and return its reply; the reply must echo the request's ``id`` (a reply to another
        request, or one without an id, means the replies can no longer be matched to questions: the worker is
        stopped with a :class:`WorkerError`)."""
        if self.process.poll() is not None:
            raise self._fail(f"has exited with status {self.process.returncode}")
        self._sent = getattr(self, "_sent", 0) + 1
        try:
            self.process.stdin.write(json.dumps({"op": op, "id": self._sent, **fields}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._fail("closed its input") from None
        try:
            line = self._replies.get(timeout=timeout or self.timeout)
        except queue.Empty:
            raise self._fail(f"gave no answer to '{op}' within {timeout or self.timeout:g} s") from None
        if line is None:
            self.process.wait(timeout=10)
            raise self._fail(f"died during '{op}' (exit status {self.process.returncode})")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise self._fail(f"wrote a line that is not protocol JSON: {line[:200]!r}") from None
        if not isinstance(reply, dict) or reply.get("id") != self._sent:
            got = reply.get("id") if isinstance(reply, dict) else None
            raise self._fail(f"answered request {got!r} where request {self._sent} ('{op}') was due: "
                             f"{line[:200]!r}")
        return reply

    def close(self, kill: bool = False) -> None:
        process = getattr(self, "process", None)
        if process is None or process.poll() is not None:
            return
        if not kill:
            try:
                process.stdin.write(json.dumps({"op": "shutdown"}) + "\n")
                process.stdin.flush()
                process.wait(timeout=30)
                return
            except (OSError, subprocess.TimeoutExpired):
                pass
        process.kill()
        process.wait(timeout=30)

    def __del__(self):
        self.close(kill=True)


class InProcessClient:
    """The same requests answered by a driver in this process (the main-environment path)."""

    def __init__(self, where: str):
        self.where = where
        self.worker = remote_worker.Worker()

    def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        try:
            return self.worker.handle({"op": op, **fields})
        except Exception as error:  # noqa: BLE001 - the protocol's per-request failure
            return {"ok": False, "error": f"{type(error).__name__}: {error}"}

    def close(self, kill: bool = False) -> None:
        self.worker.driver = None


def environment_python(name: str, where: str) -> Path:
    """The interpreter of environment ``name`` built by ``tools/make_envs.sh`` (``.envs/<name>``)."""
    root = Path(os.environ.get(ENVS_DIR_VARIABLE, ".envs"))
    python = (root / name / "bin" / "python").absolute()
    if not python.exists():
        raise ValueError(f"{where}.env: environment '{name}' is not built ({python} is missing); "
                         f"run `tools/make_envs.sh {name}`")
    return python


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _score_problem(reply: dict, asked: int, tokenizer_size: int) -> str | None:
    """What is wrong with a ``score`` reply (None: nothing): every number finite, one logit per asked token,
    an argmax among the real tokens. JSON carries NaN as null and the worker sends infinities as +-1e308."""
    logits = reply.get("logits")
    if not isinstance(logits, list) or len(logits) != asked:
        return f"{len(logits) if isinstance(logits, list) else 'no'} logits for {asked} tokens"
    for key, value in (("logsumexp", reply.get("logsumexp")), ("argmax_logit", reply.get("argmax_logit")),
                       *((f"logits[{i}]", v) for i, v in enumerate(logits))):
        if not _finite(value) or abs(value) >= 1e308:
            return f"{key} is {value!r}, not a finite number"
    argmax = reply.get("argmax_id")
    if not isinstance(argmax, int) or not 0 <= argmax < tokenizer_size:
        return f"argmax_id {argmax!r} is not a token id below {tokenizer_size}"
    return None


class RemoteCodeVLM(VisionLanguageModel):
    """A remote-code checkpoint driven through :mod:`~verbmirage.models.remote_worker` (see the module doc)."""

    backend = ""
    variant_features = REMOTE
    #: Key of the checkpoint's driver in ``remote_drivers.DRIVERS`` (an entry's ``driver:`` may replace it).
    driver = ""
    #: New tokens decoded greedily when the first answer token decides nothing (``inference.continue_tokens``).
    continue_tokens = 8

    def __init__(
        self,
        name: str,
        path: str,
        trust_remote_code: bool = False,
        dtype: str = "bfloat16",
        device: str = "cuda",
        prompts: dict | None = None,
        max_new_tokens: int = 8,
        revision: str | None = None,
        python: str | None = None,
        env: str | None = None,
        scoring: str = "logits",
        num_beams: int = 1,
        repetition_penalty: float = 1.0,
        timeout: float = 600.0,
        load_timeout: float = 3600.0,
        driver: str | None = None,
        options: dict | None = None,
    ):
        super().__init__(name)
        where = f"models.{name}"
        if not allow_remote_code(where, trust_remote_code, revision, path):
            raise ValueError(
                f"{where}.trust_remote_code: backend '{self.backend}' runs code shipped with the "
                "checkpoint; set `trust_remote_code: true` in this model's entry to allow it"
            )
        if dtype not in remote_driver.DTYPE_NAMES:
            raise ValueError(f"{where}.dtype: '{dtype}' is not one of {sorted(remote_driver.DTYPE_NAMES)}")
        if scoring not in ("logits", "text"):
            raise ValueError(f"{where}.scoring: '{scoring}' is not 'logits' or 'text'")
        if python and env:
            raise ValueError(f"{where}: give `python:` or `env:`, not both")
        try:
            self.decoding = remote_driver.decoding_tag(num_beams, repetition_penalty)
        except ValueError as error:
            raise ValueError(f"{where}.num_beams: {error}") from None
        self.where, self.path, self.revision = where, path, revision
        self.num_beams, self.repetition_penalty = int(num_beams), float(repetition_penalty)
        self.prompts = PromptTemplate.from_config(prompts, where=f"{where}.prompts")
        self.max_new_tokens, self.scoring = max_new_tokens, scoring
        self.driver = driver or self.driver  # your own: `module:Class` or `/path/file.py:Class` (as `backend:`)
        if env:
            python = str(environment_python(env, where))
        self.python = python
        if python:
            self.client = WorkerClient(python, where, timeout=timeout)
        else:
            self.client = InProcessClient(where)
        # A local folder is handed over absolute: the worker runs in another directory.
        checkpoint = str(Path(path).resolve()) if Path(path).is_dir() else path
        loaded = self._call("load", timeout=load_timeout, driver=self.driver, path=checkpoint, revision=revision,
                            dtype=dtype, device=device, options=options or {})
        self.vocab_size, self.tokenizer_size = loaded["vocab_size"], loaded["tokenizer_size"]
        self.environment, self.code = loaded.get("environment", {}), loaded.get("code", {})
        self.loaded_dtype = loaded.get("dtype", "")
        self.stop_ids = set(loaded.get("stop_ids", []))  # an answer whose first token is one of these is empty
        self.device, self.geometry = device, loaded.get("memory")
        self.vocabulary = self._call("vocabulary")["tokens"]
        self._yes_ids, self._no_ids, self._letter_ids = answer_token_ids(self.vocabulary, where)

    def _call(self, op: str, **fields) -> dict:
        """A request whose failure no question can survive (load, vocabulary)."""
        reply = self.client.request(op, **fields)
        if not reply.get("ok"):
            self.client.close(kill=True)
            raise WorkerError(f"{self.where}: '{op}' failed: {reply.get('error')}")
        return reply

    def close(self) -> None:
        self.client.close()

    def fingerprint_extra(self) -> dict:
        """What the answers depend on beyond the entry: the revision, the checkpoint code and the environment.

        ``code`` holds the sha256 of the checkpoint's ``*.py``/``*.json`` files
        as loaded; ``environment`` the versions of python, torch and
        transformers the driver runs on; ``driver`` the hash of our driver code.
        """
        return {
            "revision": self.revision,
            "code": dict(self.code),
            "environment": dict(self.environment),
            "driver": driver_code_digest(),
            "decoding": self.decoding,
        }

    # ---- requests per question --------------------------------------------------------------
    def _image(self, question: Question) -> tuple[str | None, str | None]:
        """(absolute image path, None) or (None, error naming the file)."""
        try:
            open_rgb(question.image)
        except (OSError, ValueError) as error:
            return None, f"image {question.image}: {type(error).__name__}: {error}"
        return str(Path(question.image).resolve()), None

    def prompt_text(self, question: Question, multiple_choice: bool) -> str:
        """The exact prompt string the checkpoint sees for this question."""
        image, error = self._image(question)
        if error:
            raise ValueError(error)
        reply = self.client.request("prompt", image=image, prompt=self.prompts.render(question.prompt, multiple_choice))
        if not reply.get("ok"):
            raise ValueError(f"{self.where}: {reply.get('error')}")
        return reply["text"]

    def use_batch_size(self, batch_size: int) -> int:
        """The job's batch size caps the questions of one forward in the worker (one call: one batch)."""
        self.batch_size = int(batch_size)
        return batch_size

    #: At most this many questions per forward in the worker (:meth:`use_batch_size`); None: a call's questions.
    batch_size: int | None = None

    def memory_costs(self) -> MemoryCosts | None:
        """Memory per question and per image under the current variant, from what the driver reported at load
        (:func:`~verbmirage.models.memory.remote_memory_costs`); None where it reported nothing."""
        if not self.geometry:
            return None
        beams = self.variant.num_beams if self.variant.decoding == "beam" else self.num_beams
        return remote_memory_costs(self.geometry, self.device, beams=beams,
                                   new_tokens=max(self.max_new_tokens, self.continue_tokens))

    def _items(self, questions: list[Question], fields: list[dict]) -> tuple[list, list[dict], list[int]]:
        """(per question: None or the image error, the request items of the questions whose image opens, their
        indices)."""
        errors, items, where = [None] * len(questions), [], []
        for i, (question, extra) in enumerate(zip(questions, fields)):
            image, errors[i] = self._image(question)
            if image is not None:
                items.append({"image": image, **extra})
                where.append(i)
        return errors, items, where

    def _batch(self, op: str, key: str, questions: list[Question], fields: list[dict], **settings) -> list:
        """One batch request for ``questions``: per question (reply, None) or (None, error naming the model)."""
        errors, items, where = self._items(questions, fields)
        out = [(None, error) for error in errors]
        if not items:
            return out
        reply = self.client.request(op, items=items, batch_size=self.batch_size, **settings)
        answers = reply.get(key) if reply.get("ok") else None
        if not isinstance(answers, list) or len(answers) != len(items):
            problem = reply.get("error") if not reply.get("ok") else f"{key} do not match the {len(items)} questions"
            return [(None, error or f"{self.where}: {problem}") for error in errors]
        for i, answer in zip(where, answers):
            ok = isinstance(answer, dict) and "error" not in answer
            out[i] = (answer, None) if ok else (None, f"{self.where}: {answer.get('error') if isinstance(answer, dict) else answer}")
        return out

    def _scores(self, questions: list[Question], prompts: list[str], token_ids: list[list[int]]) -> list:
        """Per question (score row, None) or (None, error): the first answer position's logits of its
        ``token_ids`` (with logsumexp and argmax), checked; a reply with a non-finite number (a float16 overflow
        comes back as null) or of the wrong shape is an error naming the question and the image, never a score."""
        fields = [{"prompt": prompt, "token_ids": ids} for prompt, ids in zip(prompts, token_ids)]
        out = self._batch("score_batch", "rows", questions, fields)
        for i, ((row, error), question) in enumerate(zip(out, questions)):
            problem = None if error else _score_problem(row, len(token_ids[i]), self.tokenizer_size)
            if problem:
                out[i] = (None, f"{self.where}: question {question.question_id} on {question.image}: the worker's "
                                f"scores are unusable ({problem})")
        return out

    def _texts(self, questions: list[Question], prompts: list[str], max_new_tokens: int,
               greedy: bool = False) -> list[tuple[str, list[int], str | None]]:
        """Per question (text, token ids, error): the checkpoint's answer under the variant's decoding (beam search
        or sampling), else the entry's (``num_beams``, ``repetition_penalty``), or plain greedy (``greedy``)."""
        requests = [(1, 1.0, {}) if greedy else self._decoding_request(q) for q in questions]
        beams, penalty = requests[0][:2] if requests else (1, 1.0)
        fields = [{"prompt": prompt, "sampling": sampling} for prompt, (_, _, sampling) in zip(prompts, requests)]
        out = []
        for (reply, error), question in zip(self._batch("generate_batch", "replies", questions, fields,
                                                        max_new_tokens=max_new_tokens, num_beams=beams,
                                                        repetition_penalty=penalty), questions):
            text, ids = (reply or {}).get("text"), (reply or {}).get("token_ids", [])
            if error is None and (not isinstance(text, str) or not isinstance(ids, list)
                                  or not all(isinstance(i, int) for i in ids)):
                error = (f"{self.where}: question {question.question_id} on {question.image}: the worker's "
                         f"'generate' reply has no text and token ids: {str(reply)[:200]}")
            out.append(("", [], error) if error else (text, ids, None))
        return out

    def _decoding_request(self, question: Question) -> tuple[int, float, dict]:
        """(num_beams, repetition_penalty, sampling settings) of a ``generate`` request: the variant's beam search
        or sampling (its seed per question, as the transformers engine), else the entry's own decoding."""
        variant = self.variant
        if variant.decoding == "beam":
            return variant.num_beams, 1.0, {"length_penalty": variant.length_penalty}
        if variant.decoding == "sample":
            return 1, 1.0, {"do_sample": True, "temperature": variant.temperature, "top_k": variant.top_k,
                            "top_p": variant.top_p, "seed": question_seed(question.question_id, variant.seed)}
        return self.num_beams, self.repetition_penalty, {}

    def _token_text(self, token_id: int) -> str:
        token = self.vocabulary[token_id] if 0 <= token_id < len(self.vocabulary) else None
        return token or ""

    @property
    def _decodes(self) -> bool:
        """Whether answers come from the variant's decoding (beam search, sampling), not the first argmax."""
        return self.variant.decoding in ("beam", "sample")

    def _answers(self, questions: list[Question], prompts: list[str], token_ids: list[list[int]], decides) -> list:
        """Per question (score row of ``token_ids``, (first token text, answer text or None), confidence, error);
        ``decides(question, token text)``: whether a first token is the answer.

        Under a decoding variant the answer is its decoded text, and the row also holds the first generated
        token (an end token too), whose probability is the confidence; ("", "") when it ended at once. Else the
        first (argmax) token, continued greedily (one batch) when it decides nothing; ("", "") when it ends
        the answer (an empty answer is unknown)."""
        if self._decodes:
            decoded = self._texts(questions, prompts, self.variant.max_new_tokens)
            firsts = [ids[0] if ids and 0 <= ids[0] < self.tokenizer_size else None for _, ids, _ in decoded]
            asked = [ids + ([first] if first is not None else []) for ids, first in zip(token_ids, firsts)]
            out = []
            for (row, error), (text, _, failed), first, ids in zip(self._scores(questions, prompts, asked), decoded,
                                                                   firsts, token_ids):
                if failed or error:
                    out.append((None, None, math.nan, failed or error))
                    continue
                # the generated first token's probability (none came back: the argmax's, the end greedy takes)
                value = row["logits"][len(ids)] if first is not None else row["argmax_logit"]
                texts = ("", "") if first is None or first in self.stop_ids else (self._token_text(first), text)
                out.append((row, texts, math.exp(value - row["logsumexp"]), None))
            return out
        out, pending = [], []
        for i, (row, error) in enumerate(self._scores(questions, prompts, token_ids)):
            if error:
                out.append((None, None, math.nan, error))
                continue
            confidence = math.exp(row["argmax_logit"] - row["logsumexp"])
            first = row["argmax_id"]
            if first in self.stop_ids:
                texts = ("", "")
            else:
                texts = (self._token_text(first), None)
                if not decides(questions[i], texts[0]) and self.continue_tokens > 0:
                    pending.append(i)
            out.append((row, texts, confidence, None))
        if pending:
            continued = self._texts([questions[i] for i in pending], [prompts[i] for i in pending],
                                    self.continue_tokens, greedy=True)
            for i, (text, _, error) in zip(pending, continued):
                row, texts, confidence, _ = out[i]
                out[i] = (row, (texts[0], None if error else text), confidence, None)
        return out

    # ---- results ----------------------------------------------------------------------------------
    def _score_yes_no(self, questions):
        prompts = [self.prompts.render(question.prompt, False) for question in questions]
        if self.scoring == "text" and not self._decodes:
            results = []
            for text, _, error in self._texts(questions, prompts, self.max_new_tokens):
                if error:
                    results.append(YesNoResult.failed(error))
                    continue
                answer, rule = parse_yes_no(text)
                p_yes = {YES: 1.0, NO: 0.0}.get(answer, math.nan)
                results.append(YesNoResult(p_yes, answer, text, math.nan, f"text:{self.decoding}:{rule}"))
            return results
        ids = self._yes_ids + self._no_ids
        results = []
        for row, texts, confidence, error in self._answers(questions, prompts, [ids] * len(questions),
                                                           lambda q, t: yes_no_token(t) is not None):
            if error:
                results.append(YesNoResult.failed(error))
                continue
            values = row["logits"][: len(ids)]
            probs = [math.exp(v - row["logsumexp"]) for v in values]
            yes, no = sum(probs[: len(self._yes_ids)]), sum(probs[len(self._yes_ids):])
            margin = yes_no_margin(values[: len(self._yes_ids)], values[len(self._yes_ids):])
            results += answers.yes_no_results(np.array([yes]), np.array([no]), [margin], [yes], [confidence],
                                              [texts], [None], self.variant.label)
        return results

    def _score_multiple_choice(self, questions):
        prompts = [self.prompts.render(question.prompt, True) for question in questions]
        if self.scoring == "text" and not self._decodes:
            results = []
            for question, (text, _, error) in zip(questions, self._texts(questions, prompts, self.max_new_tokens)):
                n = len(question.options)
                if error:
                    results.append(MultipleChoiceResult.failed(n, error))
                    continue
                letter, rule = parse_choice(text, question.options)
                probs = tuple(1.0 if letter == option_letter(i) else 0.0 for i in range(n))
                results.append(MultipleChoiceResult(probs, letter, text, math.nan, f"text:{self.decoding}:{rule}"))
            return results
        groups = [self._letter_ids[: len(question.options)] for question in questions]
        asked = [[i for group in letters for i in group] for letters in groups]
        results = []
        for question, letters, ids, (row, texts, confidence, error) in zip(
                questions, groups, asked, self._answers(questions, prompts, asked,
                                                                lambda q, t: decide_choice(t, None, q.options)[0] != UNKNOWN)):
            if error:
                results.append(MultipleChoiceResult.failed(len(question.options), error))
                continue
            values = iter(math.exp(v - row["logsumexp"]) for v in row["logits"][: len(ids)])
            mass = [sum(next(values) for _ in group) for group in letters]
            results += answers.choice_results([mass], [confidence], [texts], [None], [question.options],
                                              self.variant.label)
        return results

    def _generate(self, questions, max_new_tokens):
        return [text for text, _, _ in self._texts(questions, [q.prompt for q in questions], max_new_tokens)]


class QwenVLChat(RemoteCodeVLM):
    """Qwen/Qwen-VL-Chat: ChatML with ``Picture 1:<img>/abs/path</img>``; the image path travels in the prompt."""

    backend = driver = "qwen_vl_chat"


class MolmoVLM(RemoteCodeVLM):
    """allenai/Molmo-7B-D-0924: ``processor.process`` inputs (`` User: ... Assistant:``), images in the weights' dtype."""

    backend = driver = "molmo"
    variant_features = REMOTE_NO_BEAM  # its code cannot reorder a cache: no beam search (docs/models.md)


class MiniCPMV(RemoteCodeVLM):
    """openbmb/MiniCPM-Llama3-V-2_5: logits from its vision embedding + the LLM on ``inputs_embeds``; text via ``chat``."""

    backend = driver = "minicpm_v"


class MplugOwl2(RemoteCodeVLM):
    """MAGAer13/mplug-owl2-llama2-7b through the ``mplug_owl2`` package, in its own environment (docs/models.md).

    The package needs transformers 4.31 internals (no 5.x patch exists), so the
    entry names its worker env; the package comes from ``options: {code_dir:
    <mPLUG-Owl2 checkout>}`` or is installed there with ``--no-deps``.
    """

    backend = driver = "mplug_owl2"

    def _call(self, op: str, **fields) -> dict:
        """``code_dir`` is handed over absolute: a relative one means the job's directory, not the worker's."""
        options = fields.get("options") or {}
        if op == "load" and options.get("code_dir"):
            fields["options"] = {**options, "code_dir": str(Path(options["code_dir"]).resolve())}
        return super()._call(op, **fields)

