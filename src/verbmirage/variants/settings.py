"""Mitigation variants: how a model decodes and decides (paper Tables 5 and 8; docs/variants.md).

A config entry ``variants: {slug: {...}}`` becomes a :class:`Variant`. The
schema (schemas/config.schema.yaml) checks types; :meth:`Variant.from_config`
fills the method defaults (beam 5 for beam search and OPERA, the official VCD
and OPERA constants) and refuses combinations that mean nothing.

What a backend can run is a set of *features* (:data:`FEATURES`): a variant
needs ``variant.features()``, a backend offers
``models.registry.variant_features(backend)``. The workflow plans a (model,
variant) pair only where the backend offers every feature the variant needs;
a model entry's explicit ``variants: [...]`` list naming an unsupported pair
stops the run (:func:`model_variants`).

This module imports nothing heavy: the workflow reads it while planning.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass

from verbmirage.variants.registry import DECODINGS as _ROWS
from verbmirage.variants.registry import OperaSettings, decoding_row, decoding_strategy, readers

#: The decodings a variant may name: one per row of the registry (variants/registry.py).
DECODINGS = tuple(_ROWS)
DECISION_METHODS = ("threshold", "content_free")

#: Every feature a variant may need. ``decoding:<name>`` per decoding; the rest are switches.
FEATURES = frozenset(
    {f"decoding:{name}" for name in DECODINGS}
    | {"vcd", "prompt_suffix"}
    | {f"decision:{method}" for method in DECISION_METHODS}
)
#: Blind baselines and other scorers that decode nothing: the default variant only.
PLAIN_ONLY = frozenset({"decoding:greedy"})
#: Transformers backends: everything.
ALL_FEATURES = FEATURES
#: The feature sets of the other backends are theirs, in their registry rows (``verbmirage.models.registry``).

#: Appendix F of the paper: the ad-hoc prompt it tried.
PAPER_PROMPT_SUFFIX = " Pay attention to the verb in question."


@dataclass(frozen=True)
class VCDSettings:
    """Visual contrastive decoding (Leng et al. 2024; docs/variants.md, "How the engine decodes")."""

    alpha: float = 1.0
    beta: float = 0.1
    noise_step: int = 500


@dataclass(frozen=True)
class DecisionSettings:
    """A calibrated decision rule on the model's scores (beyond the paper; docs/variants.md, "Calibrated decisions").

    ``threshold``: the yes/no cut on ``yes_margin`` that maximises ``metric`` on a
    calibration set built like the benchmark from ``calibration_images``
    training images (never test images). ``content_free``: the answer's log-odds
    minus those of the same question on content-free images (``content_free_images``).
    """

    method: str
    metric: str = "accuracy"
    calibration_images: int = 200
    content_free_images: tuple[str, ...] = ("blank", "mean")


@dataclass(frozen=True)
class Variant:
    """One way of decoding and deciding; ``default`` is plain greedy."""

    decoding: str = "greedy"
    num_beams: int = 1
    length_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    #: New tokens decoded for beam, sampling and OPERA (greedy decodes ``inference.continue_tokens``).
    max_new_tokens: int = 10
    vcd: VCDSettings | None = None
    opera: OperaSettings | None = None
    prompt_suffix: str = ""
    decision: DecisionSettings | None = None
    paper_name: str = ""
    #: The image conditions and datasets this variant runs under (empty: all). They plan runs only; no answer
    #: depends on them.
    conditions: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    #: The question sets this variant asks (empty: every set its model asks). Plans runs only.
    qsets: tuple[str, ...] = ()
    #: Every key its decoding reads, defaults filled (an instance of its registry row's settings type): the
    #: search knobs above where the decoding reads them, and the keys of its own (filled when built).
    decoding_settings: object = None

    def __post_init__(self):
        row = decoding_row(self.decoding)
        given = self.decoding_settings
        values = {}
        for name in _field_names(row.settings):
            if name in _VARIANT_FIELDS:  # a knob kept on the variant: its value wins (dataclasses.replace)
                if getattr(self, name) is not None:
                    values[name] = getattr(self, name)
            elif given is not None and hasattr(given, name):
                values[name] = getattr(given, name)
        object.__setattr__(self, "decoding_settings", row.settings(**values))

    @classmethod
    def from_config(cls, entry: dict | None, where: str = "variants") -> "Variant":
        """The variant of one config entry; errors name ``where`` and the key.

        The keys a decoding reads, their defaults and the keys it refuses come from its registry row
        (:mod:`verbmirage.variants.registry`). A non-finite number (``.nan``, ``.inf``) is refused here too, not
        only when the run is planned: a job started from the command line (JSON admits ``NaN`` and
        ``Infinity``) never sees the plan.
        """
        entry = dict(entry or {})
        problems = non_finite_numbers(entry, where)
        if problems:
            raise ValueError("; ".join(problems))
        decoding_keys = {name for row in _ROWS.values() for name in _field_names(row.settings)}
        known = (_VARIANT_FIELDS | decoding_keys) - {"decoding_settings"}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
        decoding = entry.get("decoding", "greedy")
        if decoding not in _ROWS:
            raise ValueError(f"{where}.decoding: '{decoding}' is not one of {list(_ROWS)}")
        row = decoding_row(decoding)
        own = {f.name: f for f in fields(row.settings)}
        for key in sorted(set(entry) & decoding_keys - set(own)):
            _check_unread(key, entry[key], decoding, where)
        values = {}
        for name, spec in own.items():
            if name in entry:
                default = spec.default if spec.default is not MISSING else spec.default_factory()
                block = type(default) if is_dataclass(default) else None
                value = entry.pop(name)
                if name not in _VARIANT_FIELDS:  # a key of its own: its row's schema bounds it, planned or not
                    _check_against(value, row.schema.get(name), f"{where}.{name}")
                values[name] = block(**_checked(value or {}, block, f"{where}.{name}")) if block else value
        settings = row.settings(**values)
        entry.update({name: getattr(settings, name) for name in own if name in _VARIANT_FIELDS})
        entry["decoding_settings"] = settings
        if entry.get("vcd") is not None:
            entry["vcd"] = VCDSettings(**_checked(entry["vcd"], VCDSettings, f"{where}.vcd"))
            if not row.contrasts:
                contrasting = [name for name, other in _ROWS.items() if other.contrasts]
                raise ValueError(f"{where}.vcd: VCD combines with {', '.join(contrasting[:-1])} or {contrasting[-1]} "
                                 f"decoding, not {decoding}")
        if entry.get("decision") is not None:
            settings = _checked(entry["decision"], DecisionSettings, f"{where}.decision")
            if settings.get("method") not in DECISION_METHODS:
                raise ValueError(f"{where}.decision.method: '{settings.get('method')}' is not one of "
                                 f"{list(DECISION_METHODS)}")
            if "content_free_images" in settings:
                settings["content_free_images"] = tuple(settings["content_free_images"])
            entry["decision"] = DecisionSettings(**settings)
        for key, low in (("num_beams", 1), ("max_new_tokens", 1)):
            if int(entry.get(key, low)) < low:
                raise ValueError(f"{where}.{key}: must be at least {low}")
        if not 0 < float(entry.get("top_p", 1.0)) <= 1:
            raise ValueError(f"{where}.top_p: must be in (0, 1]")
        if float(entry.get("temperature", 1.0)) <= 0:
            raise ValueError(f"{where}.temperature: must be positive (use decoding: greedy for argmax)")
        entry["conditions"] = tuple(entry.get("conditions", ()))
        entry["datasets"] = tuple(entry.get("datasets", ()))
        entry["qsets"] = tuple(entry.get("qsets", ()))
        return cls(**entry)

    def runs_under(self, condition: str, dataset: str | None = None) -> bool:
        """Whether runs of this variant are planned under ``condition`` (and on ``dataset``, when given)."""
        return ((not self.conditions or condition in self.conditions)
                and (dataset is None or not self.datasets or dataset in self.datasets))

    def asks(self, qset: str) -> bool:
        """Whether runs of this variant ask ``qset`` (when their model and condition do)."""
        return not self.qsets or qset in self.qsets

    def features(self) -> frozenset[str]:
        """What a backend must offer to run this variant."""
        needed = {f"decoding:{self.decoding}"}
        if self.vcd is not None:
            needed.add("vcd")
        if self.prompt_suffix:
            needed.add("prompt_suffix")
        if self.decision is not None:
            needed.add(f"decision:{self.decision.method}")
        return frozenset(needed)

    @property
    def is_plain(self) -> bool:
        """Greedy answers of the model as configured (the first-token engine decides alone)."""
        return self.features() == PLAIN_ONLY

    def settings(self) -> dict:
        """Every setting the answers depend on (for fingerprints and provenance): no ``paper_name`` and no
        planning key (``conditions``, ``datasets``, ``qsets``). The keys of its decoding that are not fields of
        the variant are added flat, so that a decoding with a key of its own leaves every other variant's
        settings (and fingerprint) as they were."""
        values = asdict(self)
        own = values.pop("decoding_settings")
        for planning in ("paper_name", "conditions", "datasets", "qsets"):
            values.pop(planning)
        return {**values, **{name: value for name, value in own.items() if name not in _VARIANT_FIELDS}}

    def strategy(self):
        """The decoding strategy this variant answers with (:mod:`verbmirage.variants.registry`; imports torch)."""
        return decoding_strategy(self)

    @property
    def label(self) -> str:
        """How ``parse_rule`` names the decoding (its registry row's ``label``): ``greedy``, ``beam5``,
        ``sample``, ``opera``, ``+vcd``."""
        values = {**{name: getattr(self.decoding_settings, name) for name in _field_names(self.decoding_settings)},
                  **{name: getattr(self, name) for name in _VARIANT_FIELDS}}
        return decoding_row(self.decoding).label.format(**values) + ("+vcd" if self.vcd is not None else "")


_VARIANT_FIELDS = frozenset(f.name for f in fields(Variant))


def _field_names(settings) -> list[str]:
    return [f.name for f in fields(settings)]


def _check_unread(key: str, value, decoding: str, where: str) -> None:
    """Refuse key ``key`` of another decoding that ``decoding`` does not read, unless it is a search knob left
    unused (a ``temperature`` beside beam search is ignored, as transformers' ``GenerationConfig`` ignores it)."""
    takers = " or ".join(readers(key))
    if key == "num_beams":
        if value != 1:
            raise ValueError(f"{where}.num_beams: {decoding} decoding keeps one sequence; use decoding: {takers}")
    elif key not in _VARIANT_FIELDS or isinstance(value, dict):
        raise ValueError(f"{where}.{key}: settings for {takers} need decoding: {takers} (got '{decoding}')")


def _check_against(value, schema: dict | None, where: str) -> None:
    """A ``ValueError`` naming ``where`` when ``value`` does not meet its JSON ``schema`` (a job started by hand
    never meets the config schema)."""
    if not schema:
        return
    import jsonschema  # deferred: only decodings with keys of their own need it

    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(schema)(schema).iter_errors(value))
    if error is not None:
        raise ValueError(f"{where}: {error.message}")


def _checked(values: dict, settings_class, where: str) -> dict:
    known = {f.name for f in fields(settings_class)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(known)}")
    return dict(values)


def non_finite_numbers(value, where: str) -> list[str]:
    """One message per NaN or infinite float inside ``value`` (mappings and lists, at any depth), each naming
    its key path (``where.key[index]``) and the value as YAML writes it, e.g.
    ``variants.vcd_beam.vcd.alpha: .inf is not a finite number``.

    The schema's bounds cannot refuse them: every comparison with NaN is false, and infinity passes any
    ``minimum`` (and any key without a ``maximum``).
    """
    if isinstance(value, float) and not math.isfinite(value):
        spelled = ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
        return [f"{where}: {spelled} is not a finite number"]
    if isinstance(value, dict):
        return [problem for key, item in value.items()
                for problem in non_finite_numbers(item, f"{where}.{key}" if where else str(key))]
    if isinstance(value, (list, tuple)):
        return [problem for index, item in enumerate(value)
                for problem in non_finite_numbers(item, f"{where}[{index}]")]
    return []


def question_seed(question_id: str, seed: int) -> int:
    """The sampling seed of one question: the same whatever the batch, shard or order (64-bit)."""
    digest = hashlib.sha256(f"{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


#: Variant keys that plan runs or label them: a model's ``variant_settings`` may not change them.
VARIANT_PLANNING_KEYS = ("paper_name", "conditions", "datasets", "qsets")


def model_variant_entry(config: dict, model: str, variant: str) -> dict:
    """The entry of ``variant`` as ``model`` runs it: ``variants.<variant>`` with the model's own
    ``models.<model>.variant_settings.<variant>`` on top (a nested block such as ``vcd`` merged key by key).

    The official VCD scripts ran alpha 1 for LLaVA and Qwen-VL but 0.5 for InstructBLIP: one variant, a
    setting per model.
    """
    merged = dict(config["variants"][variant])
    own = ((config["models"].get(model) or {}).get("variant_settings") or {}).get(variant) or {}
    for key, value in own.items():
        both_blocks = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = {**merged[key], **value} if both_blocks else value
    return merged


def check_model_variant_settings(config: dict, model: str, runs: list[str]) -> None:
    """``models.<model>.variant_settings``: each names a variant the model runs, changes no planning key, and
    gives settings :meth:`Variant.from_config` accepts; errors name the key."""
    where = f"models.{model}.variant_settings"
    for variant, own in ((config["models"][model].get("variant_settings")) or {}).items():
        if variant not in runs:
            raise ValueError(f"{where}.{variant}: '{variant}' is not a variant this model runs ({runs})")
        planning = sorted(set(own) & set(VARIANT_PLANNING_KEYS))
        if planning:
            raise ValueError(f"{where}.{variant}: {planning} plan or label the variant's runs for every model; "
                             f"set them in variants.{variant}")
        Variant.from_config(model_variant_entry(config, model, variant), f"{where}.{variant}")


def model_variants(config: dict, model: str, offered: frozenset[str] | None) -> list[str]:
    """The variants planned for ``model``: its ``variants:`` list, else every configured variant its backend
    offers (``offered``; None: unknown, e.g. a custom backend, which gets the plain variants only).

    An explicit list naming an unknown or unsupported variant raises, naming the key.
    """
    entry = config["models"][model]
    variants = {slug: Variant.from_config(settings, f"variants.{slug}")
                for slug, settings in config["variants"].items()}
    if "variants" in entry:
        chosen = list(entry["variants"])
        for slug in chosen:
            if slug not in variants:
                raise ValueError(f"models.{model}.variants: '{slug}' is not a configured variant "
                                 f"(variants: {sorted(variants)})")
            missing = sorted(variants[slug].features() - offered) if offered is not None else []
            if missing:
                raise ValueError(f"models.{model}.variants: backend '{entry.get('backend')}' cannot run variant "
                                 f"'{slug}' (it needs {missing})")
        return chosen
    if offered is None:
        return [slug for slug, variant in variants.items() if variant.is_plain]
    return [slug for slug, variant in variants.items() if variant.features() <= offered]


def decision_plan(config: dict) -> dict:
    """Which variants decide how, and the one number of calibration images they share.

    One calibration set per question set (``results/benchmark/hico/calibration/<qset>.parquet``) and one mean
    image serve every decision variant, so they must agree on ``calibration_images``.
    """
    variants = {slug: Variant.from_config(entry, f"variants.{slug}") for slug, entry in config["variants"].items()}
    decisions = {slug: v.decision for slug, v in variants.items() if v.decision is not None}
    counts = {slug: d.calibration_images for slug, d in decisions.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"variants.*.decision.calibration_images: every decision variant must use the same number "
                         f"(one calibration set per question set), got {counts}")
    return {
        "threshold": [slug for slug, d in decisions.items() if d.method == "threshold"],
        "content_free": [slug for slug, d in decisions.items() if d.method == "content_free"],
        "calibration_images": next(iter(counts.values()), DecisionSettings("threshold").calibration_images),
    }
