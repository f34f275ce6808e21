"""Drivers for checkpoints that run their own code, and the worker process that hosts them.

The four remote-code checkpoints of the paper (Qwen-VL-Chat, Molmo-7B-D,
MiniCPM-Llama3-V-2.5, mPLUG-Owl2) were written for old transformers/torch
releases. A driver below holds what one checkpoint needs: loading (plus any
load-time patch for transformers 5.x), the exact prompt its official chat code
builds, the logits at the first answer position, and greedy (or stated)
decoding. Drivers run in one of two places:

- in-process, imported by :mod:`verbmirage.models.remote` in the project env;
- in a **worker**: ``<model env python> remote_worker.py`` reads one JSON
  request per line on stdin and writes one JSON reply per line on stdout, so a
  checkpoint can run on the old stack it was written for while the job stays on
  the project's pins (numpy 2, pandas 3).

This file and its siblings therefore import only the standard library at
module level (torch, transformers and PIL are imported inside the drivers) and
nothing of ``verbmirage``: ``remote_driver.py`` holds the driver base and its
helpers, ``remote_drivers.py`` and ``remote_drivers_llama.py`` the four checkpoints' drivers. Run as a script,
this file finds them beside itself (:data:`FILES`). Protocol (one JSON object per line)::

    {"op": "load", "driver", "path", "revision", "dtype", "device", "options"}
        -> {"ok": true, "vocab_size", "tokenizer_size", "dtype", "environment", "code", "memory"}
    {"op": "vocabulary"}                      -> {"ok": true, "tokens": [str | null, ...]}
    (``load`` answers the sizes, the environment, the code hashes, ``stop_ids``: the tokens that end an answer,
    and ``memory``: what the job sizes its batches from, ``Driver.memory_geometry``, or null)
    {"op": "score", "image", "prompt", "token_ids"}
        -> {"ok": true, "logits": [...], "logsumexp", "argmax_id", "argmax_logit"}
    {"op": "generate", "image", "prompt", "max_new_tokens", "num_beams", "repetition_penalty"[, "sampling"]}
        -> {"ok": true, "text", "decoding", "token_ids"}
    {"op": "score_batch", "items": [{"image", "prompt", "token_ids"}, ...], "batch_size"}
        -> {"ok": true, "rows": [score reply or {"error"}, ...], "forwards"}
    {"op": "generate_batch", "items": [{"image", "prompt"[, "sampling"]}, ...], "max_new_tokens", "num_beams",
     "repetition_penalty", "batch_size"}
        -> {"ok": true, "replies": [generate reply or {"error"}, ...], "forwards"}
    (the batch ops answer the questions of one image from one image prefix, at most ``batch_size`` per forward;
    ``forwards`` counts the prefix, suffix and one-question forwards the driver ran so far)
    {"op": "prompt", "image", "prompt"}       -> {"ok": true, "text"[, "ids"]}
    {"op": "reference", "image", "prompt", "max_new_tokens"}
        -> {"ok": true, "text"}  (the checkpoint's own chat function, sampling off: a check, not a path)
    {"op": "shutdown"}                        -> {"ok": true}, then the worker exits

A failing request answers ``{"ok": false, "error": "Type: message"}`` and the
worker keeps serving. Anything the model code prints goes to stderr.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import math
import os
import sys
import traceback
from pathlib import Path

if __package__:  # imported as verbmirage.models.remote_worker
    from verbmirage.models.remote_driver import attempt, code_hashes, environment
    from verbmirage.models.remote_drivers import DRIVERS
else:  # run as a script (or imported from this folder) in a remote-code environment
    from remote_driver import attempt, code_hashes, environment  # type: ignore[no-redef]
    from remote_drivers import DRIVERS  # type: ignore[no-redef]

PROTOCOL_VERSION = 2  # 2: replies echo the request's id, on their own descriptor
#: The files a worker runs (this one first); they travel together and their digest names the driver code.
FILES = ("remote_worker.py", "remote_driver.py", "remote_drivers.py", "remote_drivers_llama.py")


def driver_class(spec: str) -> type:
    """A registered driver, or ``package.module:Class`` / ``/path/file.py:Class`` (your own, or a test's)."""
    if spec in DRIVERS:
        return DRIVERS[spec]
    if ":" not in spec:
        raise KeyError(f"unknown driver '{spec}'; known: {sorted(DRIVERS)} or 'module:Class' or 'file.py:Class'")
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
        if module_spec is None:
            raise FileNotFoundError(f"driver file {target} not found")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, name)


# ---- the worker ------------------------------------------------------------------------------------------
class Worker:
    """Answers protocol requests with one loaded driver."""

    def __init__(self):
        self.driver = None

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        if op == "load":
            cls = driver_class(request["driver"])
            self.driver = cls(request["path"], revision=request.get("revision"), dtype=request.get("dtype", "bfloat16"),
                              device=request.get("device", "cuda"), **(request.get("options") or {}))
            folder = self.driver.code_folder() if hasattr(self.driver, "code_folder") else None
            model = getattr(self.driver, "model", None)
            return {"ok": True, "protocol": PROTOCOL_VERSION, "vocab_size": self.driver.vocab_size,
                    "dtype": str(getattr(model, "dtype", "")).replace("torch.", ""),
                    "tokenizer_size": self.driver.tokenizer_size, "environment": environment(),
                    "stop_ids": self.driver.stop_ids() if hasattr(self.driver, "stop_ids") else [],
                    "code": code_hashes(folder) if folder else {},
                    "memory": self.driver.memory_geometry() if hasattr(self.driver, "memory_geometry") else None}
        if op == "shutdown":
            return {"ok": True}
        if self.driver is None:
            raise RuntimeError(f"'{op}' before 'load'")
        if op == "vocabulary":
            return {"ok": True, "tokens": self.driver.vocabulary()}
        if op == "prompt":
            reply = {"ok": True, "text": self.driver.prompt_text(request["image"], request["prompt"])}
            if hasattr(self.driver, "prompt_ids"):
                reply["ids"] = self.driver.prompt_ids(request["image"], request["prompt"])
            return reply
        if op == "reference":
            beams = {"num_beams": int(request["num_beams"])} if "num_beams" in request else {}
            return {"ok": True, "text": self.driver.reference_text(request["image"], request["prompt"],
                                                                   int(request["max_new_tokens"]), **beams)}
        if op == "score":
            return {"ok": True, **score_row(self.driver.logits(request["image"], request["prompt"]),
                                            request["token_ids"], self.driver.tokenizer_size)}
        if op == "score_batch":
            items = request["items"]
            answered = batch_logits(self.driver, [(item["image"], item["prompt"]) for item in items],
                                    request.get("batch_size"))
            rows = [_item_error(row) if isinstance(row, Exception) else _scored(row, item, self.driver.tokenizer_size)
                    for row, item in zip(answered, items)]
            return {"ok": True, "rows": rows, "forwards": dict(getattr(self.driver, "forwards", {}))}
        if op == "generate_batch":
            items = request["items"]
            answered = batch_generate(self.driver, [(item["image"], item["prompt"]) for item in items],
                                      int(request["max_new_tokens"]), int(request.get("num_beams", 1)),
                                      float(request.get("repetition_penalty", 1.0)),
                                      [item.get("sampling") or {} for item in items], request.get("batch_size"))
            replies = [_item_error(reply) if isinstance(reply, Exception)
                       else {"text": reply[0], "decoding": reply[1], "token_ids": list(reply[2])}
                       for reply in answered]
            return {"ok": True, "replies": replies, "forwards": dict(getattr(self.driver, "forwards", {}))}
        if op == "generate":
            sampling = {"sampling": request["sampling"]} if request.get("sampling") else {}
            text, tag = self.driver.generate(request["image"], request["prompt"], int(request["max_new_tokens"]),
                                             num_beams=int(request.get("num_beams", 1)),
                                             repetition_penalty=float(request.get("repetition_penalty", 1.0)),
                                             **sampling)
            return {"ok": True, "text": text, "decoding": tag, "token_ids": list(self.driver.last_token_ids)}
        raise ValueError(f"unknown op '{op}'")


def batch_logits(driver, items: list[tuple[str, str]], batch_size) -> list:
    """The driver's ``logits_batch``; for a driver without one (your own), its ``logits`` question by question."""
    if hasattr(driver, "logits_batch"):
        return driver.logits_batch(items, batch_size)
    return [attempt(driver.logits, image, question) for image, question in items]


def batch_generate(driver, items, max_new_tokens, num_beams, repetition_penalty, sampling, batch_size) -> list:
    """The driver's ``generate_batch``; for a driver without one, its ``generate`` question by question."""
    if hasattr(driver, "generate_batch"):
        return driver.generate_batch(items, max_new_tokens, num_beams, repetition_penalty, sampling, batch_size)
    out = []
    for (image, question), settings in zip(items, sampling):
        extra = {"sampling": settings} if settings else {}
        reply = attempt(driver.generate, image, question, max_new_tokens, num_beams=num_beams,
                      repetition_penalty=repetition_penalty, **extra)
        out.append(reply if isinstance(reply, Exception) else (*reply, list(driver.last_token_ids)))
    return out


def _item_error(error: Exception) -> dict:
    """One item's failure inside a batch reply (the other items keep their answers)."""
    return {"error": f"{type(error).__name__}: {error}"}


def _scored(row, item: dict, tokenizer_size: int) -> dict:
    try:
        return score_row(row, item["token_ids"], tokenizer_size)
    except Exception as error:  # noqa: BLE001 - the item's failure
        return _item_error(error)


def score_row(row, token_ids: list[int], tokenizer_size: int) -> dict:
    """What the adapter needs of one logits row: chosen entries, and logsumexp/argmax over real tokens.

    Columns past the tokenizer (padding rows of the output layer) are left out,
    so they can neither win the argmax nor take probability mass.
    """
    import torch

    row = row.float().reshape(-1)[: int(tokenizer_size)]
    index = torch.tensor([int(i) for i in token_ids], dtype=torch.long)
    if len(index) and int(index.max()) >= row.shape[0]:
        raise ValueError(f"token id {int(index.max())} is outside the {row.shape[0]} real tokens")
    best = int(torch.argmax(row))
    return {"logits": row[index].tolist(), "logsumexp": float(torch.logsumexp(row, 0)), "argmax_id": best,
            "argmax_logit": float(row[best])}


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def serve(stdin=None, stdout=None) -> None:
    """The request loop. Replies go to ``stdout`` only and echo each request's ``id``; everything else the
    checkpoint's code prints goes to stderr (the job log)."""
    stdin = stdin or sys.stdin
    reply_stream = stdout or sys.stdout
    worker = Worker()
    with contextlib.redirect_stdout(sys.stderr):
        for line in stdin:
            if not line.strip():
                continue
            request = None
            try:
                request = json.loads(line)
                reply = worker.handle(request)
            except Exception as error:  # noqa: BLE001 - every failure becomes a reply; the worker keeps serving
                traceback.print_exc(file=sys.stderr)
                reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            if isinstance(request, dict) and "id" in request:
                reply = {**reply, "id": request["id"]}
            reply_stream.write(json.dumps(_json_safe(reply)) + "\n")
            reply_stream.flush()
            if isinstance(request, dict) and request.get("op") == "shutdown":
                break


def protocol_stream():
    """A text stream on a copy of file descriptor 1 for the replies, with descriptor 1 itself pointed at stderr:
    C-level prints of the checkpoint's code (CUDA and cuDNN warnings write to descriptor 1, below Python's
    ``sys.stdout``) then reach the job log instead of the protocol."""
    sys.stdout.flush()
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", encoding="utf-8", buffering=1, closefd=False)
    return replies


if __name__ == "__main__":
    # Run as a script, this folder is sys.path[0]: its modules (api.py, base.py, ...) must not shadow the
    # packages the checkpoint code imports.
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != here]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    serve(stdout=protocol_stream())
