"""Pangea as training data for the paper's LoRA fine-tune (paper Appendix D; docs/models.md, "Fine-tuned models (Pangea LoRA)").

Pangea (li2024isolated) pools many action datasets and maps their labels to VerbNet nodes; its files are
read by :mod:`verbmirage.data.pangea`.

:func:`build_training_questions` turns the samples into questions in our question schema
(``io.QUESTIONS``, qsets ``train_yn`` / ``train_mc``), with the benchmark's MC layout and answer protocol:
sources excluded by pattern (the paper's Kinetics-700 and HAKE, and, ours, every HICO-derived source: the
benchmark's test images must not be trained on), images drawn per source in proportion to the source's
share of the kept samples (seeded), one MC question (the image's label and 3 wrong labels of the same
source) and one YN question per image, exactly ``1 / (1 + k)`` of the YN questions answered yes.
:func:`check_no_test_images` then fails the build if a HICO test image (by file name or by content) is
among the training images.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from string import ascii_uppercase

import numpy as np
import pandas as pd

from verbmirage.benchmark.pangea_settings import TrainingQuestionSettings, excluded_by
from verbmirage.benchmark.question_table import QUESTIONS
from verbmirage.benchmark.sampling import content_hash, draw, mc_prompt, named_rng
from verbmirage.core.io import write_table
from verbmirage.core.paths import UnsafePathError, atomic_path, safe_relative_name, write_text
from verbmirage.core.schemas import PANGEA_SOURCES
from verbmirage.data.hico import load_hico
from verbmirage.data.pangea import Pangea, PangeaFiles, load_pangea

log = logging.getLogger(__name__)

DATASET = "pangea"
#: Question sets of a training table (registered kinds in ``verbmirage.benchmark.questions``).
QSET_YN, QSET_MC = "train_yn", "train_mc"
#: Paper, Appendix D: 60K MC + 60K YN questions, Yes:No about 1:19, 280 of the 290 nodes covered.
PAPER_NUMBERS = {"mc_questions": 60_000, "yn_questions": 60_000, "yn_yes_share": 1 / 20, "nodes_covered": 280,
                 "nodes_selected": 290}


# ---- training questions ----------------------------------------------------------------------------------------
def normalise_label(label: str) -> str:
    """``unevenbar_cross`` -> ``unevenbar cross``; case and runs of spaces folded (one label, one spelling)."""
    return " ".join(label.replace("_", " ").split()).lower()




def allocate(total: int, weights: dict[str, int], caps: dict[str, int]) -> dict[str, int]:
    """``total`` split over sources in proportion to ``weights`` (largest remainder), none above its cap;
    what a capped source cannot take goes to the others, again in proportion."""
    counts = {name: 0 for name in weights}
    remaining = min(total, sum(caps.values()))
    while remaining > 0:
        open_ = [name for name in weights if counts[name] < caps[name] and weights[name] > 0]
        if not open_:
            break
        weight_sum = sum(weights[name] for name in open_)
        exact = {name: remaining * weights[name] / weight_sum for name in open_}
        share = {name: int(np.floor(exact[name])) for name in open_}
        leftover = remaining - sum(share.values())
        for name in sorted(open_, key=lambda n: (-(exact[n] - share[n]), n))[:leftover]:
            share[name] += 1
        given = 0
        for name in open_:
            take = min(share[name], caps[name] - counts[name])
            counts[name] += take
            given += take
        remaining -= given
        if given == 0:
            break
    return counts


@dataclass
class TrainingQuestions:
    """The question table and what it took: per-source counts and the 290-node coverage."""

    questions: pd.DataFrame
    sources: pd.DataFrame
    nodes_covered: int
    nodes_selected: int
    used_images: list[str]


def build_training_questions(data: Pangea, settings: TrainingQuestionSettings = TrainingQuestionSettings()
                             ) -> TrainingQuestions:
    """Pangea's samples as MC and YN training questions (see the module docstring for the protocol)."""
    samples = data.samples.copy()
    samples["excluded_by"] = [excluded_by(s, settings.exclude_sources) or "" for s in samples.source]
    samples["norm_labels"] = [sorted({normalise_label(label) for label in labels} - {""})
                              for labels in samples.labels]
    unsafe = []
    for index, image in zip(samples.index, samples.image):
        try:
            safe_relative_name(image, "image_name")
        except UnsafePathError:
            unsafe.append(index)
    if unsafe:
        log.warning("pangea: %d sample(s) with an unsafe image_name left out, e.g. %r", len(unsafe),
                    samples.image[unsafe[0]])
    kept = samples[(samples.excluded_by == "") & samples.norm_labels.map(bool) & ~samples.index.isin(unsafe)]
    kept = kept.drop_duplicates("image")  # one image, one sample: the first listing wins
    source_labels = {source: set().union(*group.norm_labels) for source, group in kept.groupby("source")}
    need_mc = settings.mc_options - 1

    def wrong(row) -> set[str]:
        return source_labels[row.source] - set(row.norm_labels)

    kept = kept.assign(n_wrong=[len(wrong(row)) for row in kept.itertuples()])
    weights = kept.groupby("source").size().to_dict()
    counts = {}
    for kind, total, minimum in (("mc", settings.mc_questions, need_mc), ("yn", settings.yn_questions, 1)):
        caps = kept[kept.n_wrong >= minimum].groupby("source").size().reindex(list(weights), fill_value=0)
        counts[kind] = allocate(total, weights, caps.to_dict())
    chosen: dict[str, list] = {"mc": [], "yn": []}
    for source, group in kept.groupby("source"):
        order = group.sort_values("image")
        order = order.iloc[named_rng(settings.seed, "order", source).permutation(len(order))]
        for kind, minimum in (("mc", need_mc), ("yn", 1)):
            chosen[kind] += list(order[order.n_wrong >= minimum].head(counts[kind][source]).itertuples())
    for kind, asked in (("mc", settings.mc_questions), ("yn", settings.yn_questions)):
        if len(chosen[kind]) < asked:
            log.warning("pangea: %d %s questions asked, %d images can carry one", asked, kind, len(chosen[kind]))
    n_yes = round(len(chosen["yn"]) / (1 + settings.negatives_per_positive))
    yes_rows = set(named_rng(settings.seed, "yes").permutation(len(chosen["yn"]))[:n_yes].tolist())

    rows = []
    for row in chosen["mc"]:
        rng = named_rng(settings.seed, QSET_MC, row.source, row.image)
        label = row.norm_labels[int(rng.integers(len(row.norm_labels)))]
        texts = [label] + draw(rng, wrong(row), need_mc)
        order = [int(i) for i in rng.permutation(len(texts))]
        options = [texts[i] for i in order]
        rows.append((QSET_MC, row, label, mc_prompt(settings.mc_stem, options), options,
                     ascii_uppercase[order.index(0)]))
    for position, row in enumerate(chosen["yn"]):
        rng = named_rng(settings.seed, QSET_YN, row.source, row.image)
        if position in yes_rows:
            label, answer = row.norm_labels[int(rng.integers(len(row.norm_labels)))], "yes"
        else:
            label, answer = draw(rng, wrong(row), 1)[0], "no"
        rows.append((QSET_YN, row, label, settings.yn_prompt.replace("{action}", label), [], answer))
    questions = pd.DataFrame({
        "question_id": [content_hash(DATASET, qset, row.image, prompt, options, answer)
                        for qset, row, _, prompt, options, answer in rows],
        "dataset": DATASET,
        "qset": [r[0] for r in rows],
        "image_id": [r[1].image for r in rows],
        "image": [r[1].image for r in rows],
        "verb": [r[2] for r in rows],
        "object": None,
        "hoi_id": pd.array([None] * len(rows), dtype="Int64"),
        "prompt": [r[3] for r in rows],
        "options": [r[4] for r in rows],
        "answer": [r[5] for r in rows],
        "rotation": 0,
        "rare": False,
        "common": False,
    })
    questions["group_id"] = questions["question_id"]
    used = sorted({row.image for kind in chosen.values() for row in kind})
    selected = set(data.selected_nodes)
    nodes_of = dict(zip(kept.image, kept.nodes))
    covered = set().union(*[set(nodes_of[image]) for image in used]) & selected if used else set()
    return TrainingQuestions(questions, _source_table(samples, kept, rows, selected, unsafe), len(covered),
                             len(selected), used)


def _source_table(samples: pd.DataFrame, kept: pd.DataFrame, rows: list, selected: set, unsafe: list
                  ) -> pd.DataFrame:
    """Per source: kept or why not, samples, labels, questions asked, the 290-subset nodes its questions reach."""
    table = []
    asked = pd.DataFrame([(qset, row.source, row.image, answer) for qset, row, _, _, _, answer in rows],
                         columns=["qset", "source", "image", "answer"])
    nodes_of = dict(zip(kept.image, kept.nodes))
    for source, group in samples.groupby("source"):
        mine = asked[asked.source == source]
        reached = set().union(*[set(nodes_of[i]) for i in mine.image.unique()]) & selected if len(mine) else set()
        table.append({
            "source": source,
            "excluded_by": group.excluded_by.iloc[0],
            "samples": len(group),
            "unsafe_names": int(group.index.isin(unsafe).sum()),
            "labels": len(set().union(*group.norm_labels)),
            "images": int(mine.image.nunique()),
            "mc_questions": int((mine.qset == QSET_MC).sum()),
            "yn_yes": int(((mine.qset == QSET_YN) & (mine.answer == "yes")).sum()),
            "yn_no": int(((mine.qset == QSET_YN) & (mine.answer == "no")).sum()),
            "nodes_covered": len(reached),
        })
    return pd.DataFrame(table)


def summary_markdown(built: TrainingQuestions, settings: TrainingQuestionSettings) -> str:
    """Our numbers beside the paper's (Appendix D, main text: 280 of 290 nodes)."""
    questions = built.questions
    yn = questions[questions.qset == QSET_YN]
    yes_share = float((yn.answer == "yes").mean()) if len(yn) else float("nan")
    lines = [
        "| quantity | ours | paper |", "| --- | --- | --- |",
        f"| images asked | {len(built.used_images)} | 60,000 |",
        f"| MC questions | {int((questions.qset == QSET_MC).sum())} | {PAPER_NUMBERS['mc_questions']:,} |",
        f"| YN questions | {len(yn)} | {PAPER_NUMBERS['yn_questions']:,} |",
        f"| YN yes share | {yes_share:.3f} (1:{settings.negatives_per_positive} asked) | about 0.05 (1:19) |",
        f"| selected nodes covered | {built.nodes_covered} of {built.nodes_selected} | "
        f"{PAPER_NUMBERS['nodes_covered']} of {PAPER_NUMBERS['nodes_selected']} |",
        "", "Sources left out (pattern): " + (", ".join(
            f"{s} ({p})" for s, p in zip(built.sources.source, built.sources.excluded_by) if p) or "none")
        + ". Kinetics-700 and HAKE: the paper's; HICO-derived sources: ours (leakage: the benchmark asks HICO's "
        "test images).",
    ]
    return "\n".join(lines) + "\n"


# ---- leakage ----------------------------------------------------------------------------------------------------
class LeakageError(RuntimeError):
    """A benchmark test image is among the training images."""


def _digest(path: Path) -> str:
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def check_no_test_images(images: dict[str, Path], test_images: Iterable[Path]) -> int:
    """Fail (LeakageError naming both files) if a training image is a HICO test image.

    ``images``: training image name -> its file. A training image leaks if its file name (stem, any
    case) is a test image's, or if its bytes equal a test image's (files of equal size are hashed; a
    re-encoded or resized copy is not caught). Returns how many training images were checked.
    """
    test_images = [Path(p) for p in test_images]
    stems = {p.stem.lower(): p for p in test_images}
    for name in sorted(images):
        stem = Path(name).stem.lower()
        if stem in stems:
            raise LeakageError(f"training image '{name}' has the file name of HICO test image {stems[stem]}; "
                               "leave its source out (pangea.exclude_sources)")
    by_size: dict[int, list[Path]] = {}
    for path in test_images:
        by_size.setdefault(path.stat().st_size, []).append(path)
    digests: dict[int, dict[str, Path]] = {}
    for name in sorted(images):
        path = Path(images[name])
        size = path.stat().st_size
        if size not in by_size:
            continue
        if size not in digests:
            digests[size] = {_digest(p): p for p in by_size[size]}
        twin = digests[size].get(_digest(path))
        if twin is not None:
            raise LeakageError(f"training image '{name}' ({path}) is byte for byte HICO test image {twin}; "
                               "leave its source out (pangea.exclude_sources)")
    return len(images)


def hico_test_images(hico_root: str | Path) -> list[Path]:
    """The files of HICO's test images (``anno.mat``'s test list under ``images/test2015``)."""

    anno = load_hico(hico_root)
    files = [Path(hico_root) / anno.image_relpath("test", name) for name in anno.images["test"]]
    missing = [path for path in files if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"{len(missing)} HICO test image(s) missing, e.g. {missing[0]}: the leakage check "
                                "compares their contents")
    return files


def image_files(data: Pangea, names: Iterable[str]) -> dict[str, Path]:
    """The files of ``names`` under the images folder; an error naming the missing ones."""
    files = {name: data.images / name for name in names}
    missing = sorted(name for name, path in files.items() if not path.is_file())
    if missing:
        raise FileNotFoundError(f"{len(missing)} Pangea image(s) missing under {data.images}: {missing[:5]}")
    return files


# ---- a mini Pangea in the real format (demo and tests) -----------------------------------------------------
#: (source, labels); node ids are drawn from DEMO_NODES. Sources cover every rule: two kept ones, a HICO
#: one (left out: leakage), a Kinetics and a HAKE one (left out as in the paper).
DEMO_SOURCES = {
    "HAA": ["kayaking", "unevenbar_cross", "rowing_boat", "juggling_balls", "push_up"],
    "charades": ["Putting a laptop somewhere", "Holding a cup", "Opening a door", "Sitting on a chair"],
    "Home_Action_Genome": ["type_on laptop", "drink_from cup", "sit_on sofa", "watch tv"],
    "HICO_DET": ["ride_horse", "hold_cup", "walk_dog", "sit_on_chair"],
    "Kinetics700": ["dancing", "surfing_water", "riding_bike", "playing_guitar"],
    "HAKE": ["eat_pizza", "hold_umbrella", "ride_bicycle", "kick_ball"],
}
DEMO_NODES = ("escape-51.1-1-3", "meander-47.7", "run-51.3.2", "hold-15.1", "put-9.1", "sit-50",
              "drink-39.1-2", "perform-26.7-1", "push-12", "open-45.4", "watch-30.3", "ride-51.4.2")
#: Indices of the selected nodes (8 of 12 here; 290 of 898 in Pangea): "sit-50" (5) and three more are not.
DEMO_NODE_INDEX = [0, 1, 2, 3, 4, 8, 9, 11]
#: A node outside the subset that stands in, in the kept sources, for the last node (selected): so the
#: default questions cover 7 of the 8 selected nodes.
DEMO_UNREACHED_NODE = "sit-50"


def write_demo_pangea(root: str | Path, seed: int = 0, samples_per_source: int = 8, image_size: int = 32) -> Path:
    """Write a mini Pangea at ``root`` in the real files' format (pickles of plain lists/dicts, the JSON,
    PNG images named as in image_name); every label maps to fixed nodes, one of them outside the subset."""
    from PIL import Image

    root = Path(root)
    files = PangeaFiles()
    paths = files.paths(root)
    paths["images"].mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    label_nodes = {}
    for s, (source, labels) in enumerate(DEMO_SOURCES.items()):
        for k, label in enumerate(labels):
            nodes = [DEMO_NODES[(3 * s + k) % len(DEMO_NODES)], DEMO_NODES[(5 * s + 2 * k + 1) % len(DEMO_NODES)]]
            if excluded_by(source, TrainingQuestionSettings.exclude_sources) is None:  # one selected node only
                nodes = [DEMO_UNREACHED_NODE if n == DEMO_NODES[-1] else n for n in nodes]  # excluded sources reach
            label_nodes[(source, label)] = nodes
    samples = []
    for source, labels in DEMO_SOURCES.items():
        prefix = {"HICO_DET": "HICO_train2015_"}.get(source, f"{source}_")
        for i in range(samples_per_source):
            picked = [labels[i % len(labels)]]
            if i % 3 == 2:  # some images have two labels
                picked.append(labels[(i + 1) % len(labels)])
            nodes = sorted({node for label in picked for node in label_nodes[(source, label)]})
            name = f"{prefix}{i + 1:08d}.png"
            samples.append((source, name, picked, nodes))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            with atomic_path(paths["images"] / name) as tmp:
                Image.new("RGB", (image_size, image_size), colour).save(tmp, format="PNG")
    topology = {"Father2Son": {DEMO_NODES[0]: [DEMO_NODES[1], DEMO_NODES[2]]}, "objects": list(DEMO_NODES)}
    for key, data in (("samples", samples), ("topology", topology), ("node_index", list(DEMO_NODE_INDEX))):
        with atomic_path(paths[key]) as tmp, tmp.open("wb") as stream:
            pickle.dump(data, stream, protocol=4)
    label2node = {f"{source}//{label}": nodes * 2 for (source, label), nodes in label_nodes.items()}
    write_text(paths["label2node"], json.dumps(label2node, indent=1, sort_keys=True))
    return root


def write_training_questions(pangea_root: str | Path, files: PangeaFiles, settings: TrainingQuestionSettings,
                             hico_root: str | Path, questions: str | Path, sources: str | Path,
                             summary: str | Path) -> TrainingQuestions:
    """Build the training questions of a Pangea root, check them against HICO's test images (LeakageError
    stops the build), and write the question table, the per-source table and the Markdown summary."""

    data = load_pangea(pangea_root, files)
    built = build_training_questions(data, settings)
    if built.questions.empty:
        raise ValueError(f"{pangea_root}: no training question could be built (every source excluded or too "
                         "few labels per source)")
    checked = check_no_test_images(image_files(data, built.used_images), hico_test_images(hico_root))
    log.info("pangea: %d training images checked against HICO's test images: none leaks", checked)
    provenance = {"pangea": str(pangea_root), "settings": settings.__dict__}
    write_table(built.questions, questions, QUESTIONS, provenance=provenance)
    write_table(built.sources, sources, PANGEA_SOURCES, provenance=provenance)
    write_text(summary, "## Pangea training questions\n\n" + summary_markdown(built, settings))
    return built
