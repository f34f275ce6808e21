"""Smoke test of the remote-code models with their real weights: goldens stored once, re-checked after changes.

A remote-code model's numbers can drift without any error: a new revision of
the checkpoint, another transformers or torch in its worker env, bf16 instead
of fp32. :func:`run_smoke` asks every remote model entry of a config a few
fixed questions (one yes/no and one multiple-choice per image, plus a short
decoded answer), and :func:`compare` checks the answers against goldens
stored by the first run: the predictions and decoded texts must be equal, the
probabilities within a tolerance. The diff names each answer that moved and
what changed in the model's fingerprint (revision, checkpoint code, versions).
``tools/remote_smoke.py`` is the command line.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from verbmirage.benchmark.question_sets import MC_STEM
from verbmirage.core.paths import file_digest, write_text
from verbmirage.models.base import Question
from verbmirage.models.registry import backend_class, create_model

GOLDENS_VERSION = 1
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
YN_QUESTION = "Is there a person in the image?"
MC_OPTIONS = ("riding a bicycle", "eating a pizza", "holding an umbrella", "no action")
TEXT_QUESTION = "What is the person doing? Answer in a few words."
DEFAULT_TOLERANCE = 0.02
DEFAULT_MAX_NEW_TOKENS = 12


def smoke_images(folder: str | Path, count: int = 4) -> list[Path]:
    """The first ``count`` images of ``folder`` by name (a handful is enough to see drift)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"--images {folder}: not a folder")
    images = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise FileNotFoundError(f"--images {folder}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    return images[:count]


def remote_entries(config: dict, only: list[str] | None = None) -> dict[str, dict]:
    """The config's model entries whose backend runs checkpoint code (a subclass of RemoteCodeVLM)."""
    from verbmirage.models.remote import RemoteCodeVLM  # deferred: imports torch

    models = config.get("models") or {}
    if only:
        unknown = [slug for slug in only if slug not in models]
        if unknown:
            raise ValueError(f"--models: {unknown} not in the config's models ({sorted(models)})")
    chosen = {}
    for slug, entry in models.items():
        if only and slug not in only:
            continue
        if issubclass(backend_class(entry["backend"]), RemoteCodeVLM):
            chosen[slug] = entry
        elif only:
            raise ValueError(f"models.{slug}: backend '{entry['backend']}' is not a remote-code backend")
    return chosen


def _finite(value: float) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def ask(model, images: list[Path], max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> dict[str, dict]:
    """The answers of one model: ``<image name>|yn``, ``|mc`` and ``|text`` records."""
    answers = {}
    mc_prompt = "\n".join([MC_STEM] + [f"{chr(ord('A') + k)}. {o}" for k, o in enumerate(MC_OPTIONS)])
    for image in images:
        yn = model.score_yes_no([Question(f"{image.name}|yn", YN_QUESTION, image=image)])[0]
        answers[f"{image.name}|yn"] = {"prediction": yn.prediction, "p_yes": _finite(yn.p_yes),
                                       "confidence": _finite(yn.confidence), "raw_answer": yn.raw_answer,
                                       "parse_rule": yn.parse_rule, "error": yn.error}
        mc = model.score_multiple_choice([Question(f"{image.name}|mc", mc_prompt, image=image, options=MC_OPTIONS)])[0]
        answers[f"{image.name}|mc"] = {"prediction": mc.prediction, "option_probs": [_finite(p) for p in mc.option_probs],
                                       "confidence": _finite(mc.confidence), "raw_answer": mc.raw_answer,
                                       "parse_rule": mc.parse_rule, "error": mc.error}
        text = model.generate([Question(f"{image.name}|text", TEXT_QUESTION, image=image)], max_new_tokens)[0]
        answers[f"{image.name}|text"] = {"text": text}
    return answers


@dataclass
class Report:
    """Differences of one model's answers from its goldens (empty ``lines``: it matches)."""

    model: str
    lines: list[str] = field(default_factory=list)
    context: list[str] = field(default_factory=list)
    stored: bool = False
    failed: bool = False

    @property
    def ok(self) -> bool:
        return not self.lines and not self.failed

    def render(self, goldens_path: str | Path) -> str:
        if self.failed:
            return f"FAIL {self.model}: " + "; ".join(self.lines)
        if self.stored:
            return f"stored {self.model}: goldens written to {goldens_path}"
        if self.ok:
            since = f" (changed since the goldens: {'; '.join(self.context)})" if self.context else ""
            return f"ok {self.model}: every answer matches {goldens_path}{since}"
        out = [f"DIFF {self.model}: {len(self.lines)} difference(s) from {goldens_path}"]
        out += [f"    what changed: {line}" for line in self.context]
        out += [f"    {line}" for line in self.lines]
        return "\n".join(out)


def _close(old, new, tolerance: float) -> bool:
    if old is None or new is None:
        return old is None and new is None
    return abs(old - new) <= tolerance


def compare(model: str, golden: dict, current: dict, tolerance: float = DEFAULT_TOLERANCE) -> Report:
    """What differs between a model's stored record and this run's (answers, images and fingerprint)."""
    report = Report(model)
    for name, digest in golden.get("images", {}).items():
        now = current.get("images", {}).get(name)
        if now is None:
            report.lines.append(f"image {name}: in the goldens but not among this run's images")
        elif now != digest:
            report.lines.append(f"image {name}: its bytes changed since the goldens were stored")
    old_settings, new_settings = golden.get("settings", {}), current.get("settings", {})
    report.context = [f"{key} {old_settings.get(key)} -> {new_settings.get(key)}"
                      for key in sorted(set(old_settings) | set(new_settings))
                      if old_settings.get(key) != new_settings.get(key)]
    report.context += _fingerprint_changes(golden.get("fingerprint", {}), current.get("fingerprint", {}))
    old_answers, new_answers = golden.get("answers", {}), current.get("answers", {})
    for key in sorted(set(old_answers) | set(new_answers)):
        old, new = old_answers.get(key), new_answers.get(key)
        if old is None or new is None:
            report.lines.append(f"{key}: {'new answer, not in the goldens' if old is None else 'missing in this run'}")
            continue
        for what in ("error", "prediction", "text", "raw_answer", "parse_rule"):
            if old.get(what) != new.get(what):
                report.lines.append(f"{key}: {what} {old.get(what)!r} -> {new.get(what)!r}")
        for what in ("p_yes", "confidence"):
            if what in old and not _close(old[what], new.get(what), tolerance):
                report.lines.append(f"{key}: {what} {_show(old[what])} -> {_show(new.get(what))}"
                                    f"{_delta(old[what], new.get(what), tolerance)}")
        if "option_probs" in old:
            before, after = old["option_probs"], new.get("option_probs") or []
            if len(before) != len(after) or not all(_close(a, b, tolerance) for a, b in zip(before, after)):
                report.lines.append(f"{key}: option_probs {_show(before)} -> {_show(after)} "
                                    f"(tolerance {tolerance:g})")
    return report


def _show(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return "None" if value is None else f"{value:.4f}"


def _delta(old, new, tolerance) -> str:
    if old is None or new is None:
        return ""
    return f" (|diff| {abs(old - new):.4f} > tolerance {tolerance:g})"


def _fingerprint_changes(old: dict, new: dict) -> list[str]:
    """Readable changes of revision, decoding, driver, versions and checkpoint code files."""
    changes = []
    for key in ("revision", "decoding"):
        if old.get(key) != new.get(key):
            changes.append(f"{key} {old.get(key)} -> {new.get(key)}")
    if old.get("driver") != new.get("driver"):
        changes.append(f"driver code {str(old.get('driver'))[:12]} -> {str(new.get('driver'))[:12]}")
    old_env, new_env = old.get("environment", {}), new.get("environment", {})
    for name in sorted(set(old_env) | set(new_env)):
        if old_env.get(name) != new_env.get(name):
            changes.append(f"{name} {old_env.get(name)} -> {new_env.get(name)}")
    old_code, new_code = old.get("code", {}), new.get("code", {})
    edited = sorted(name for name in set(old_code) | set(new_code) if old_code.get(name) != new_code.get(name))
    if edited:
        changes.append(f"checkpoint code files {', '.join(edited)}")
    return changes


def load_goldens(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        return {"version": GOLDENS_VERSION, "models": {}}
    try:
        goldens = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"goldens {path}: not JSON ({error})") from None
    if not isinstance(goldens, dict) or goldens.get("version") != GOLDENS_VERSION or "models" not in goldens:
        raise ValueError(f"goldens {path}: not a version-{GOLDENS_VERSION} goldens file of tools/remote_smoke.py")
    return goldens


def save_goldens(path: str | Path, goldens: dict) -> None:
    write_text(path, json.dumps(goldens, indent=2, sort_keys=True) + "\n")


def run_smoke(config: dict, images_dir: str | Path, goldens_path: str | Path, update: bool = False,
              only: list[str] | None = None, count: int = 4, tolerance: float = DEFAULT_TOLERANCE,
              max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, log=print) -> list[Report]:
    """Ask each remote model; store goldens where there are none (or with ``update``), else compare.

    A model that fails to load is reported and the others still run. The goldens
    file is written once at the end, with the models that were stored.
    """

    images = smoke_images(images_dir, count)
    digests = {image.name: file_digest(image) for image in images}
    goldens = load_goldens(goldens_path)
    entries = remote_entries(config, only)
    if not entries:
        raise ValueError("the config has no remote-code model entries (backends qwen_vl_chat, molmo, minicpm_v, "
                         "mplug_owl2 or your own RemoteCodeVLM subclass)")
    reports, changed = [], False
    for slug, entry in entries.items():
        log(f"{slug}: loading ({entry.get('path')}, {entry.get('env') or entry.get('python') or 'in-process'})")
        started = time.monotonic()
        try:
            model = create_model(slug, entry)
        except Exception as error:  # noqa: BLE001 - report it and go on with the other models
            reports.append(Report(slug, [f"could not load: {type(error).__name__}: {error}"], failed=True))
            continue
        try:
            current = {"images": digests, "answers": ask(model, images, max_new_tokens),
                       "fingerprint": model.fingerprint_extra(),
                       "settings": {k: entry.get(k) for k in ("path", "revision", "dtype", "env", "python")},
                       "stored_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        except Exception as error:  # noqa: BLE001
            reports.append(Report(slug, [f"failed while answering: {type(error).__name__}: {error}"], failed=True))
            continue
        finally:
            model.close()
        log(f"{slug}: {len(current['answers'])} answers in {time.monotonic() - started:.0f} s")
        errors = [f"{key}: {record['error']}" for key, record in current["answers"].items() if record.get("error")]
        if errors:
            reports.append(Report(slug, errors, failed=True))
            continue
        if update or slug not in goldens["models"]:
            goldens["models"][slug] = current
            reports.append(Report(slug, stored=True))
            changed = True
        else:
            reports.append(compare(slug, goldens["models"][slug], current, tolerance))
    if changed:
        save_goldens(goldens_path, goldens)
    return reports
