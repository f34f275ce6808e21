"""Checks of the workflow config that a JSON schema cannot express.

``rules/common.smk`` first re-reads each config file with
:func:`check_yaml_file` (duplicate keys), validates the config against
``schemas/config.schema.yaml`` (types, defaults), then calls
:func:`check_config`, so a bad config stops before any job runs, with a
message that names the offending key.

A config is code: it names the backends and checkpoints that run. Nothing
here imports a user's module; custom backends must be allow-listed under
``custom_backends`` and are only located on disk (:func:`locate_module`).
"""

from __future__ import annotations

import difflib
import importlib.machinery
import os
import sys
from pathlib import Path

import yaml

from verbmirage.benchmark.condition_types import CONDITIONS, PLANNING_KEYS
from verbmirage.benchmark.question_sets import CHARADES_QUESTION_SETS, QUESTION_SETS
from verbmirage.core.errors import ConfigError
from verbmirage.data.hico_files import hico_det_file
from verbmirage.models.api import DEFAULT_API_KEY_ENV, DEFAULT_BASE_URL, check_endpoint
from verbmirage.models.base import allow_remote_code
from verbmirage.models.derived import DERIVED_FOLDER, effective_models
from verbmirage.models.registry import (
    BACKENDS,
    TINY_FAMILIES,
    WORKFLOW_KEYS,
    backend_settings,
    setting_problems,
    variant_features,
)
from verbmirage.models.remote_drivers import DRIVERS
from verbmirage.variants.settings import Variant, check_model_variant_settings, model_variants, non_finite_numbers

# The demo's roots (a root pointing there need not exist yet) and the downloads folder: verbmirage.workflow.paths
from verbmirage.workflow.paths import (
    DEMO_CHARADES_ROOT,
    DEMO_HICO_DET_ROOT,
    DEMO_HICO_ROOT,
    DEMO_PANGEA_ROOT,
    DOWNLOADS_FOLDER,
    TINY_MODEL,
)


def check_schema(config: dict, schema_path: str | Path) -> None:
    """Every schema violation as one line ``key.path: problem``, before Snakemake's own validation (which
    fills the defaults but names the key only after a dump of the whole schema)."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = sorted(validator.iter_errors(config), key=lambda error: list(map(str, error.absolute_path)))
    if problems:
        lines = [f"{'.'.join(map(str, error.absolute_path)) or '(top level)'}: {_shortened(_message(error))}"
                 for error in problems]
        raise ConfigError("the config does not match schemas/config.schema.yaml:\n  " + "\n  ".join(lines))


def _message(error) -> str:
    """jsonschema's words, except for a value that may be one of a few kinds (``batch_size``: a number or
    ``auto``), whose message would name none of them."""
    branches = error.validator_value if error.validator == "anyOf" else None
    if branches and all(branch and set(branch) <= {"type", "minimum", "const"} for branch in branches):
        kinds = [repr(branch["const"]) if "const" in branch else
                 f"{'an' if branch['type'][0] in 'aeiou' else 'a'} {branch['type']}"
                 + (f" >= {branch['minimum']}" if "minimum" in branch else "") for branch in branches]
        return f"{error.instance!r} is not {' or '.join(kinds)}"
    return error.message


def _shortened(message: str, limit: int = 300) -> str:
    """A schema message quotes the wrong value whole: a long list would bury the key it names."""
    return message if len(message) <= limit else message[: limit - 1] + "…"


#: The most values (scalars, lists, mappings) a config file may hold once its aliases (``*name``) are expanded.
#: configs/paper.yaml holds about 500; YAML aliases share one value, so a file of a few lines can stand for
#: billions of them ("billion laughs"), and every check that walks the config would run until memory ran out.
MAX_CONFIG_VALUES = 100_000


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last silently)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(
                f"{node.start_mark.name}: line {key_node.start_mark.line + 1}: key '{key}' appears twice in one "
                f"mapping (first on line {seen[key] + 1}); YAML would silently keep the last one"
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def check_yaml_file(path: str | Path) -> dict:
    """Load a YAML config file, refusing duplicate keys at any depth and aliases that expand to more than
    :data:`MAX_CONFIG_VALUES` values (or into themselves); the error names file, line and key."""
    with open(path) as stream:
        loader = _StrictLoader(stream)  # what yaml.load does, with a look at the nodes before they become values
        try:
            root = loader.get_single_node()  # aliases still share one node here
            if root is None:
                return None
            _check_expansion(root, str(path))
            return loader.construct_document(root)
        finally:
            loader.dispose()


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Refuse a document whose aliases expand to more than :data:`MAX_CONFIG_VALUES` values, naming the
    outermost key whose value does so through an alias (or holds the most of them)."""
    sizes: dict[int, int] = {}
    uses: dict[int, int] = {}  # how often each node is a child: more than once means an alias points at it

    def children(node: yaml.Node) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if isinstance(node, yaml.MappingNode):
            return [(str(getattr(key, "value", "?")), value, key) for key, value in node.value]
        if isinstance(node, yaml.SequenceNode):
            return [(f"[{index}]", value, value) for index, value in enumerate(node.value)]
        return []

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = MAX_CONFIG_VALUES + 1  # while counting: an alias of a value inside itself never ends
        total = 1
        for _, child, _ in children(node):
            uses[id(child)] = uses.get(id(child), 0) + 1
            total = min(total + size(child), MAX_CONFIG_VALUES + 1)
        sizes[id(node)] = total
        return total

    if size(root) <= MAX_CONFIG_VALUES:
        return
    path, line, node = "", root.start_mark.line + 1, root
    while uses.get(id(node), 0) <= 1:
        name, child, mark = max(children(node), key=lambda item: sizes[id(item[1])], default=(None, None, None))
        if child is None:
            break
        path = f"{path}{name}" if name.startswith("[") or not path else f"{path}.{name}"
        line, node = mark.start_mark.line + 1, child
    raise ConfigError(f"{where}: line {line}: {path or '(top level)'}: its aliases (*name) expand to more than "
                      f"{MAX_CONFIG_VALUES:,} values, or into themselves; a config needs far fewer (YAML aliases "
                      "share a value, so a few lines can stand for billions: an alias bomb)")


def locate_module(dotted: str):
    """The import spec of ``dotted`` found on ``sys.path`` without executing any of its packages.

    ``importlib.util.find_spec`` imports parent packages (running their
    ``__init__``); walking the path finders level by level does not.
    """
    search = None
    spec = None
    for depth, part in enumerate(dotted.split(".")):
        name = ".".join(dotted.split(".")[: depth + 1])
        spec = importlib.machinery.PathFinder.find_spec(name, search if search is not None else sys.path)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    return spec


def _check_custom_backend(slug: str, backend: str, allowed: list[str]) -> None:
    module, _, cls = backend.partition(":")
    if not module or not cls:
        raise ConfigError(f"models.{slug}.backend: '{backend}' is not 'package.module:Class'")
    if module not in allowed:
        raise ConfigError(
            f"models.{slug}.backend: module '{module}' is not listed under custom_backends; a custom backend runs "
            f"its module's code, so list it explicitly (custom_backends: [{module}])"
        )
    if locate_module(module) is None:
        raise ConfigError(f"models.{slug}.backend: module '{module}' cannot be found on the Python path")


def _check_backend_settings(slug: str, entry: dict) -> None:
    """A setting the backend does not take (a typo, or one of another backend) stops the plan, not the job."""
    accepted = backend_settings(entry["backend"])
    if accepted is None:
        return
    unknown = sorted(set(entry) - WORKFLOW_KEYS - accepted)
    if unknown:
        hints = [f"'{key}' -> '{close[0]}'" for key in unknown
                 if (close := difflib.get_close_matches(key, sorted(accepted), n=1))]
        raise ConfigError(
            f"models.{slug}: backend '{entry['backend']}' takes no setting(s) {unknown}"
            + (f" (did you mean {', '.join(hints)}?)" if hints else "")
            + f"; it takes {sorted(accepted)} and the workflow's {sorted(WORKFLOW_KEYS - {'backend'})}"
        )
    problems = setting_problems(entry["backend"], entry)
    if problems:
        raise ConfigError(f"models.{slug}.{problems[0]}" + "".join(f"; models.{slug}.{p}" for p in problems[1:])
                          + f" (backend '{entry['backend']}'; docs/models.md, \"Backends\")")
    modes = BACKENDS[entry["backend"]].image_modes if entry["backend"] in BACKENDS else ()
    if "image_mode" in entry and modes and entry["image_mode"] not in modes:
        raise ConfigError(f"models.{slug}.image_mode: {entry['image_mode']!r} is not one of {list(modes)} for "
                          f"backend '{entry['backend']}' (docs/models.md, \"Image processing\")")


def _check_box_condition(slug: str, entry: dict, config: dict) -> None:
    """A crop condition needs HICO-DET boxes and a margin >= 0 (its only parameter)."""
    if not config["datasets"]["hico"].get("det_root"):
        raise ConfigError(f"conditions.{slug}: type '{entry['type']}' crops to HICO-DET boxes; "
                          "set datasets.hico.det_root")
    margin = entry.get("margin", 0.1)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 100:
        raise ConfigError(f"conditions.{slug}.margin: {margin!r} is not a number >= 0")


def _check_custom_driver(slug: str, driver: str, allowed: list[str]) -> None:
    """A remote model's ``driver:`` other than a registered one runs its code in the worker: allow-list it too."""

    if driver in DRIVERS:
        return
    target = driver.rpartition(":")[0] or driver
    if target not in allowed:
        raise ConfigError(
            f"models.{slug}.driver: '{driver}' is not a registered driver ({sorted(DRIVERS)}); a custom driver runs "
            f"its code, so list it explicitly (custom_backends: [{target}])"
        )


def known_question_sets() -> list[str]:
    """Every question set the package can build (HICO's, then CharadesEgo's): what a ``qsets`` list may name.

    A set that this run does not ask is allowed there (narrowing ``questions.sets`` keeps a config valid);
    a name that is no set at all is a typo and refused.
    """

    return list(QUESTION_SETS) + list(CHARADES_QUESTION_SETS)


def condition_question_sets(config: dict, condition: str, dataset: str, dataset_sets: list[str]) -> list[str]:
    """The sets of ``dataset`` asked under ``condition``: its ``qsets`` when given, else all of them.

    Box conditions (crop) need HICO-DET boxes, so they ask nothing of another dataset.
    """
    entry = config["conditions"][condition]
    if dataset != "hico" and CONDITIONS[entry["type"]].needs_boxes:
        return []
    chosen = entry.get("qsets")
    return [q for q in dataset_sets if chosen is None or q in chosen]


def _check_pangea(config: dict, workdir: Path) -> None:
    """A Pangea fine-tune (``lora_finetune`` without ``questions``) needs ``datasets.pangea``, whose root
    holds the samples pickle unless it is the demo's or a download's."""
    pangea = config["datasets"].get("pangea")
    for slug, entry in config["models"].items():
        derive = entry.get("derive") or {}
        if derive.get("method") == "lora_finetune" and not derive.get("questions") and not pangea:
            raise ConfigError(f"models.{slug}.derive: a fine-tune on Pangea (no `questions`) needs datasets.pangea "
                              "(its root: the folder with the samples pickle and Images/)")
    if not pangea or Path(pangea["root"]) == Path(DEMO_PANGEA_ROOT):
        return
    root = Path(pangea["root"])
    downloaded = [Path(DOWNLOADS_FOLDER) / name for name in config.get("downloads", {})]
    samples = pangea.get("samples", "B123_train_KIN-FULL_with_node.pkl")
    if not any(root == folder or folder in root.parents for folder in downloaded) and not (
            workdir / root / samples).is_file():
        raise ConfigError(f"datasets.pangea.root: '{root}' has no {samples}")


def _check_model_folder(where: str, value, workdir: Path, built: set[str], downloaded: list[Path],
                        offline: bool = False, revision: str | None = None) -> None:
    """A model's ``path`` or ``adapter`` that is no folder here must be a hub id, or one the run builds or
    downloads: an absolute path, or a relative one transformers would not take as a hub id ('org/name':
    ``resources/models/x``, ``./x``), is refused at planning rather than in the model's job. With ``offline``
    (``local_files_only: true``) a hub id must be in the Hugging Face cache already (looked up, never fetched)."""
    if not isinstance(value, str) or (workdir / value).exists() or value in built:
        return
    if any(Path(value) == folder or folder in Path(value).parents for folder in downloaded):
        return
    if Path(value).is_absolute() or not _could_be_hub_id(value):
        raise ConfigError(f"{where}: no folder '{value}' (a local checkpoint must exist where the run is planned: "
                          f"here, {workdir.resolve()}), and it is not a hub id ('org/name')")
    if offline and not _in_hub_cache(value, revision):
        raise ConfigError(f"{where}: no folder '{value}' here ({workdir.resolve()}), nor a checkpoint of that hub id "
                          "in the Hugging Face cache, and local_files_only: true forbids downloading it; give the "
                          "folder's path, or download the checkpoint first")


def _in_hub_cache(repo_id: str, revision: str | None) -> bool:
    """Whether the Hugging Face cache holds a checkpoint of ``repo_id`` (its ``config.json``), as transformers would
    find it offline; nothing is fetched."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)


def _could_be_hub_id(value: str) -> bool:
    """Whether transformers would take ``value`` as a hub id ('org/name' or 'name'), by huggingface_hub's rule."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def _check_sampled_models(config: dict) -> None:
    """A model asked a sample of each set (``sample_questions``) answers other questions than the rest: it may not
    vote in an ensemble or enter an analysis that compares models question by question."""
    sampled = [slug for slug, entry in config["models"].items() if entry.get("sample_questions")]
    for slug, entry in config["models"].items():
        if "sample_seed" in entry and not entry.get("sample_questions"):
            raise ConfigError(f"models.{slug}.sample_seed: set with sample_questions only")
    analysis = config.get("analysis") or {}
    uses = [(f"ensembles.{name}", members) for name, members in (config.get("ensembles") or {}).items()]
    uses += [(f"analysis.{key}.models", (analysis.get(key) or {}).get("models") or [])
             for key in ("known_object", "object_reliance")]
    for where, members in uses:
        clash = sorted(set(members) & set(sampled))
        if clash:
            raise ConfigError(f"{where}: {clash} asked a sample of each set (models.<slug>.sample_questions): they "
                              "answer other questions than the rest, so they cannot be compared question by question")


def check_config(config: dict, workdir: str | Path = ".") -> None:
    """Raise :class:`ConfigError` on the first problem found.

    First, anywhere in the config: a number that is NaN or infinite (YAML ``.nan``, ``.inf``), which the
    schema's bounds let through and which would reach a model (a VCD ``alpha: .inf`` answers every question
    "unknown") or switch a check off (``max_error_share: .nan`` fails no job).
    """
    problems = non_finite_numbers(config, "")
    if problems:
        raise ConfigError("; ".join(problems))
    workdir = Path(workdir)
    _check_pangea(config, workdir)
    _check_sampled_models(config)
    built = {TINY_MODEL.format(family=family) for family in TINY_FAMILIES}  # rules tiny_model and derive_model
    built |= {DERIVED_FOLDER.format(model=slug) for slug, entry in config["models"].items() if "derive" in entry}
    try:  # a derived entry (models.<slug>.derive) is checked as the entry its jobs load
        config = {**config, "models": effective_models(config)}
    except ValueError as error:
        raise ConfigError(str(error)) from None
    hico = config["datasets"]["hico"]
    downloaded = [Path(DOWNLOADS_FOLDER) / name for name in config.get("downloads", {})]
    for key, demo in (("root", DEMO_HICO_ROOT), ("det_root", DEMO_HICO_DET_ROOT)):
        value = hico.get(key, "")
        if not value or Path(value) == Path(demo):
            continue
        if any(Path(value) == folder or folder in Path(value).parents for folder in downloaded):
            continue  # a configured download brings it
        if key == "root" and not (workdir / value / "anno.mat").is_file():
            raise ConfigError(f"datasets.hico.root: '{value}' has no anno.mat")
        if key == "det_root" and hico_det_file(workdir / value) is None:
            raise ConfigError(f"datasets.hico.det_root: '{value}' has no anno_bbox.mat or instances_test2015.json")

    charades = config["datasets"].get("charadesego")
    if charades and Path(charades["root"]) != Path(DEMO_CHARADES_ROOT):
        root = Path(charades["root"])
        inside_download = any(root == folder or folder in root.parents for folder in downloaded)
        if not inside_download and not (workdir / root / "CharadesEgo" / "Charades_v1_classes.txt").is_file():
            raise ConfigError(f"datasets.charadesego.root: '{root}' has no CharadesEgo/Charades_v1_classes.txt")
        videos = Path(charades.get("videos") or root / "CharadesEgo_v1_480")
        videos_downloaded = any(videos == folder or folder in videos.parents for folder in downloaded)
        if not videos_downloaded and not (workdir / videos).is_dir():
            key = "videos" if charades.get("videos") else "root"
            raise ConfigError(f"datasets.charadesego.{key}: no video folder '{videos}' (the <id>.mp4 files; "
                              "datasets.charadesego.videos names it when it is not <root>/CharadesEgo_v1_480)")
    for slug, entry in config["models"].items():
        if ":" in entry["backend"]:
            _check_custom_backend(slug, entry["backend"], config.get("custom_backends", []))
        elif entry["backend"] not in BACKENDS:
            raise ConfigError(
                f"models.{slug}.backend: unknown backend '{entry['backend']}'; known: {sorted(BACKENDS)}"
            )
        else:
            _check_backend_settings(slug, entry)
        for key in ("path", "adapter"):
            _check_model_folder(f"models.{slug}.{key}", entry.get(key), workdir, built, downloaded,
                                offline=key == "path" and entry.get("local_files_only") is True,
                                revision=entry.get("revision"))
        if entry["backend"] == "openai":

            try:
                check_endpoint(f"models.{slug}", entry.get("base_url", DEFAULT_BASE_URL),
                               entry.get("api_key_env", DEFAULT_API_KEY_ENV))
            except ValueError as error:
                raise ConfigError(str(error)) from None
        if entry.get("driver") is not None:
            _check_custom_driver(slug, str(entry["driver"]), config.get("custom_backends", []))
        if "trust_remote_code" in entry:
            path = entry.get("path")
            local = str(workdir / path) if path and not Path(path).is_absolute() else path
            try:
                allow_remote_code(f"models.{slug}", entry["trust_remote_code"], entry.get("revision"), local)
            except ValueError as error:
                raise ConfigError(str(error)) from None
    for slug, settings in config.get("variants", {}).items():
        try:
            variant = Variant.from_config(settings, f"variants.{slug}")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        unknown = sorted(set(variant.conditions) - set(config.get("conditions", {})))
        if unknown:
            raise ConfigError(f"variants.{slug}.conditions: unknown condition(s) {unknown}")
        unknown_sets = sorted(set(variant.qsets) - set(known_question_sets()))
        if unknown_sets:
            raise ConfigError(f"variants.{slug}.qsets: {unknown_sets} are not question sets; "
                              f"known: {known_question_sets()}")
    for slug, entry in config["models"].items():
        try:
            runs = model_variants(config, slug, variant_features(entry["backend"]))
            check_model_variant_settings(config, slug, runs)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        unknown_sets = sorted(set(entry.get("qsets", [])) - set(known_question_sets()))
        if unknown_sets:
            raise ConfigError(f"models.{slug}.qsets: {unknown_sets} are not question sets; "
                              f"known: {known_question_sets()}")
    for slug, entry in config.get("conditions", {}).items():
        if "_vs_" in slug:
            raise ConfigError(
                f"conditions.{slug}: a condition name cannot contain '_vs_' (it separates the two conditions "
                "of an error-consistency pair in file names)"
            )
        if entry["type"] not in CONDITIONS:
            raise ConfigError(
                f"conditions.{slug}.type: unknown image condition '{entry['type']}'; known: {sorted(CONDITIONS)}"
            )
        known = ["type", *sorted(PLANNING_KEYS), *CONDITIONS[entry["type"]].parameters()]
        unknown = sorted(set(entry) - set(known))
        if unknown:
            raise ConfigError(f"conditions.{slug}: unknown key(s) {unknown} for type '{entry['type']}' "
                              f"(known: {', '.join(known)})")
        problems = CONDITIONS[entry["type"]].value_problems(entry)
        if problems:
            raise ConfigError("; ".join(f"conditions.{slug}.{problem}" for problem in problems))
        if CONDITIONS[entry["type"]].needs_boxes:
            _check_box_condition(slug, entry, config)
        unknown_sets = sorted(set(entry.get("qsets", [])) - set(known_question_sets()))
        if unknown_sets:
            raise ConfigError(f"conditions.{slug}.qsets: {unknown_sets} are not question sets; "
                              f"known: {known_question_sets()}")
    models = set(config["models"])
    for name, members in config.get("ensembles", {}).items():
        if name in models:
            raise ConfigError(f"ensembles.{name}: the name is already a model slug")
        unknown = sorted(set(members) - models)
        if unknown:
            raise ConfigError(f"ensembles.{name}: unknown model(s) {unknown}")
    conditions = set(config.get("conditions", {}))
    for i, pair in enumerate(config.get("metrics", {}).get("error_consistency", [])):
        unknown = sorted(set(pair) - conditions)
        if unknown:
            raise ConfigError(f"metrics.error_consistency[{i}]: unknown condition(s) {unknown}")
        if pair[0] == pair[1]:
            raise ConfigError(f"metrics.error_consistency[{i}]: a condition is compared with itself")
        shared = set.intersection(
            *(set(condition_question_sets(config, c, "hico", config["questions"]["sets"])) for c in pair)
        )
        if not shared:
            raise ConfigError(f"metrics.error_consistency[{i}]: {pair[0]} and {pair[1]} share no HICO question "
                              "set (conditions.*.qsets)")


def stop_message(error: Exception, configfiles) -> str:
    """A failed planning check as the user reads it: their config file first, then the key and the problem, and
    no traceback (the key is the place to look, not the workflow's code). ``configfiles``: those named on the
    command line (none: the demo's ``config.yaml``)."""
    names = [_shown(file) for file in configfiles] or ["config.yaml"]
    text = str(error)
    first = text.split(":", 1)[0]
    if any(first == name or Path(first).name == Path(name).name for name in names):
        return text  # names its file already (a YAML file's own problem, with its line)
    return f"{', '.join(names)}: {text}"


def _shown(path) -> str:
    """``path`` relative to the working directory when it lies below it (as the user typed it, mostly)."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative
