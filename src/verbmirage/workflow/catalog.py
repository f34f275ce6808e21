"""What there is to choose from (``verbmirage list``): the backends, question sets, decodings and image
conditions the package offers, and the models, variants, conditions and ensembles a config sets up.

Read from the registries themselves (nothing imported that a backend needs: torch and transformers stay out),
so a new backend, set, decoding or condition appears here as soon as its registry line exists.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from verbmirage.benchmark.condition_types import CONDITIONS
from verbmirage.benchmark.question_sets import CHARADES_QUESTION_SETS, QUESTION_SETS
from verbmirage.models.registry import BACKENDS, backend_summary
from verbmirage.variants.registry import DECODINGS, strategy_summary
from verbmirage.workflow.config import check_yaml_file

#: The sections of ``verbmirage list``, in the order printed.
SECTIONS = ("backends", "qsets", "decodings", "conditions", "config")


def offered() -> dict[str, list[tuple[str, str]]]:
    """(name, one line) per backend, question set, decoding and image condition the package offers."""
    qsets = [(name, f"{spec.kind}: {spec.description}") for name, spec in QUESTION_SETS.items()]
    qsets += [(name, f"{kind}: CharadesEgo, the {name.split('_')[1]} view of each paired action")
              for name, kind in CHARADES_QUESTION_SETS.items()]
    return {
        "backends": [(name, backend_summary(name)) for name in BACKENDS],
        "qsets": qsets,
        "decodings": [(name, strategy_summary(name)) for name in DECODINGS],
        "conditions": [(name, condition.description) for name, condition in CONDITIONS.items()],
    }


def configured(config: dict) -> dict[str, list[tuple[str, str]]]:
    """(slug, one line) per model, variant, image condition and ensemble of ``config`` (as written)."""
    models = []
    for slug, entry in (config.get("models") or {}).items():
        entry = entry or {}
        what = entry.get("backend") or f"derived ({(entry.get('derive') or {}).get('method', '?')} of "\
                                          f"{(entry.get('derive') or {}).get('base', '?')})"
        notes = [f"paper: {entry['paper_name']}"] if entry.get("paper_name") else []
        notes += [f"stand-in: {entry['stand_in']}"] if entry.get("stand_in") else []
        models.append((slug, what + (f" ({'; '.join(notes)})" if notes else "")))
    variants = []
    for slug, entry in (config.get("variants") or {}).items():
        entry = entry or {}
        parts = [entry.get("decoding", "greedy")] + [key for key in ("vcd", "prompt_suffix", "decision")
                                                     if entry.get(key) is not None]
        variants.append((slug, " + ".join(parts) + (f" (paper: {entry['paper_name']})"
                                                   if entry.get("paper_name") else "")))
    conditions = [(slug, ", ".join(f"{key} {value}" for key, value in (entry or {}).items()) or "clean")
                  for slug, entry in (config.get("conditions") or {}).items()]
    ensembles = [(name, " + ".join(members)) for name, members in (config.get("ensembles") or {}).items()]
    return {"models": models, "variants": variants, "conditions": conditions, "ensembles": ensembles}


_TITLES = {
    "backends": "backends (models.<slug>.backend)",
    "qsets": "question sets (questions.sets)",
    "decodings": "decodings (variants.<slug>.decoding)",
    "conditions": "image condition types (conditions.<slug>.type)",
}


def _block(title: str, rows: list[tuple[str, str]], width: int = 110) -> str:
    name_width = max((len(name) for name, _ in rows), default=0) + 2
    lines = [f"{title}:"]
    for name, text in rows:
        wrapped = textwrap.wrap(text, width - name_width - 2) or [""]
        lines.append(f"  {name.ljust(name_width)}{wrapped[0]}")
        lines += [f"  {' ' * name_width}{more}" for more in wrapped[1:]]
    return "\n".join(lines)


def listing(section: str = "all", configfile: str | Path | None = None) -> str:
    """The text of ``verbmirage list``: one section of :data:`SECTIONS`, or all of them (the config's last)."""
    blocks = []
    for name, rows in offered().items():
        if section in ("all", name):
            blocks.append(_block(_TITLES[name], rows))
    if section in ("all", "config"):
        path = Path(configfile) if configfile else Path("config.yaml")
        for name, rows in configured(check_yaml_file(path)).items():
            blocks.append(_block(f"{path}: {name}", rows))
    return "\n\n".join(blocks) + "\n"
