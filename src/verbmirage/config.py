"""Checks of the workflow config that a JSON schema cannot express.

``rules/common.smk`` first validates the config against
``schemas/config.schema.yaml`` (types, defaults), then calls
:func:`check_config`, so a bad config stops before any job runs, with a
message that names the offending key.
"""

from __future__ import annotations

from pathlib import Path

from verbmirage.conditions import CONDITIONS
from verbmirage.models.registry import BACKENDS

# Where rule `demo_hico` writes the demo; a root pointing here need not exist yet.
DEMO_HICO_ROOT = "resources/demo/hico_20150920"
DEMO_HICO_DET_ROOT = "resources/demo/hico_20160224_det"
DEMO_CHARADES_ROOT = "resources/demo/charadesego"
# Where rule `fetch_dataset` unpacks `downloads.<name>`.
DOWNLOADS_FOLDER = "resources/data"


class ConfigError(ValueError):
    """The config is invalid; the message names the key."""


def check_config(config: dict, workdir: str | Path = ".") -> None:
    """Raise :class:`ConfigError` on the first problem found."""
    workdir = Path(workdir)
    hico = config["datasets"]["hico"]
    downloaded = [Path(DOWNLOADS_FOLDER) / name for name in config.get("downloads", {})]
    for key, demo in (("root", DEMO_HICO_ROOT), ("det_root", DEMO_HICO_DET_ROOT)):
        value = hico.get(key, "")
        if not value or Path(value) == Path(demo):
            continue
        if any(Path(value) == folder or folder in Path(value).parents for folder in downloaded):
            continue  # a configured download brings it
        required = "anno.mat" if key == "root" else "anno_bbox.mat"
        if not (workdir / value / required).is_file():
            raise ConfigError(f"datasets.hico.{key}: '{value}' has no {required}")

    charades = config["datasets"].get("charadesego")
    if charades and Path(charades["root"]) != Path(DEMO_CHARADES_ROOT):
        root = Path(charades["root"])
        inside_download = any(root == folder or folder in root.parents for folder in downloaded)
        if not inside_download and not (workdir / root / "CharadesEgo" / "Charades_v1_classes.txt").is_file():
            raise ConfigError(f"datasets.charadesego.root: '{root}' has no CharadesEgo/Charades_v1_classes.txt")
    for slug, entry in config["models"].items():
        if entry["backend"] not in BACKENDS and ":" not in entry["backend"]:
            raise ConfigError(
                f"models.{slug}.backend: unknown backend '{entry['backend']}'; known: {sorted(BACKENDS)}"
            )
    for slug, entry in config.get("conditions", {}).items():
        if entry["type"] not in CONDITIONS:
            raise ConfigError(
                f"conditions.{slug}.type: unknown image condition '{entry['type']}'; known: {sorted(CONDITIONS)}"
            )
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
