"""An independent HICO question builder: the protocol of docs/questions.md written the slow, obvious way.

One pass per question set over every image, each image's label sets read again from its row, plausible
HOIs found by scanning all 600, one dict per row, ids through ``json.dumps``, as the package's builder
did before it was made fast (``verbmirage.benchmark.questions.build_question_sets``); kept as that one's oracle: the
tables must be equal, row for row and id for id (tests/fast/test_question_builder.py; bench/question_sets.py
times both). The random streams are the protocol's own (one per image and set, seeded from (seed, set,
image)), drawn in the same order, so equal tables mean the same sampling.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from string import ascii_uppercase

import numpy as np
import pandas as pd

from verbmirage.core.text import hoi_phrase, object_name, object_with_article, verb_phrase

NO_INTERACTION = "no_interaction"
MC_STEM = "Which of the following actions is present in the image?"


def _hash(*parts) -> str:
    payload = json.dumps(parts, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.blake2b(payload.encode(), digest_size=8).hexdigest()


def _rng(seed: int, qset: str, image_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(qset.encode()), zlib.crc32(image_id.encode())])


def _draw(rng, pool, k: int) -> list:
    pool = sorted(pool)
    k = min(k, len(pool))
    if k == 0:
        return []
    return [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))]


def _asked(rng, positives: list, pool_size: int, k: int, protocol: str) -> list:
    count = len(positives) if protocol == "all_positives" else min(len(positives), pool_size // k)
    return positives if count == len(positives) else _draw(rng, positives, count)


def _circular(texts: list[str], rng) -> list[tuple[str, str, list[str], tuple, int]]:
    """(prompt, letter, options, group key, rotation) of every rotation; the correct text is texts[0]."""
    order = [int(i) for i in rng.permutation(len(texts))]
    out = []
    for rotation in range(len(order)):
        rotated = order[rotation:] + order[:rotation]
        options = [texts[i] for i in rotated]
        prompt = "\n".join([MC_STEM] + [f"{ascii_uppercase[k]}. {text}" for k, text in enumerate(options)])
        out.append((prompt, ascii_uppercase[rotated.index(0)], options, (texts[0], tuple(sorted(texts))), rotation))
    return out


def _yn_obj(verb: str, obj: str) -> str:
    return f"Is someone {verb_phrase(verb)} {object_with_article(obj)}?"


def reference_question_set(anno, qset: str, seed: int = 0, k: int = 2, mc_options: int = 4,
                           rare_threshold: float = 0.2, common_verbs=("hold", "ride", "sit_on", "straddle", "carry"),
                           protocol: str = "paired", images=None, dataset: str = "hico") -> pd.DataFrame:
    """One question table of the test split, as ``build_question_set(anno, qset, QuestionSettings(...))``."""
    verbs, objects = list(anno.hois.verb), list(anno.hois.object)
    real = [h for h in range(len(verbs)) if verbs[h] != NO_INTERACTION]
    all_objects = sorted(set(objects))
    train_positives = (anno.labels["train"] == 1).sum(axis=0)
    rare = set()
    for obj in all_objects:
        hois = [h for h in real if objects[h] == obj]
        total = train_positives[hois].sum()
        rare |= {h for h in hois if total > 0 and train_positives[h] / total < rare_threshold}
    rows = []
    for name, row in zip(anno.images["test"], anno.labels["test"]):
        image = f"images/test2015/{name}"
        if images is not None and name not in images:
            continue
        image_id = name.rsplit(".", 1)[0]
        positives = {h for h in real if row[h] == 1}
        ambiguous = {h for h in range(len(row)) if row[h] == 0}
        present = {objects[h] for h in range(len(row)) if not np.isnan(row[h])}
        rng = _rng(seed, qset, image_id)

        def hoi_pool(obj):
            return {h for h in real if objects[h] == obj} - positives - ambiguous

        plausible = {verbs[h] for h in real if objects[h] in present}
        verb_pool = plausible - {verbs[h] for h in positives} - {verbs[h] for h in ambiguous}
        by_object = {}
        for h in sorted(positives):
            by_object.setdefault(objects[h], []).append(h)
        positive_verbs = sorted({verbs[h] for h in positives})
        drafts = []  # (prompt, answer, verb, object, hoi, options, group key, rotation)
        if qset == "yn_obj":
            for obj in sorted(by_object):
                pool = hoi_pool(obj)
                asked = _asked(rng, by_object[obj], len(pool), k, protocol)
                negatives = _draw(rng, pool, k * len(asked))
                drafts += [(_yn_obj(verbs[h], obj), a, verbs[h], obj, h, [], (), 0)
                           for h, a in [(h, "yes") for h in asked] + [(h, "no") for h in negatives]]
        elif qset == "yn_verb":
            asked = _asked(rng, positive_verbs, len(verb_pool), k, protocol)
            negatives = _draw(rng, verb_pool, k * len(asked))
            drafts += [(f"Is someone {verb_phrase(v)} something?", a, v, None, None, [], (), 0)
                       for v, a in [(v, "yes") for v in asked] + [(v, "no") for v in negatives]]
        elif qset == "mc_obj":
            for h in sorted(positives):
                pool = hoi_pool(objects[h])
                if len(pool) < mc_options - 1:
                    continue
                chosen = [h] + _draw(rng, pool, mc_options - 1)
                texts = [hoi_phrase(verbs[c], objects[h]) for c in chosen]
                drafts += [(p, a, verbs[h], objects[h], h, o, g, r) for p, a, o, g, r in _circular(texts, rng)]
        elif qset == "mc_verb":
            if len(verb_pool) >= mc_options - 1:
                for v in positive_verbs:
                    texts = [verb_phrase(c) for c in [v] + _draw(rng, verb_pool, mc_options - 1)]
                    drafts += [(p, a, v, None, None, o, g, r) for p, a, o, g, r in _circular(texts, rng)]
        elif qset == "obj_exist":
            asks_objects = any(
                (len(hs) if protocol == "all_positives" else min(len(hs), len(hoi_pool(o)) // k)) > 0
                for o, hs in by_object.items())
            asks_verbs = (len(positive_verbs) if protocol == "all_positives"
                          else min(len(positive_verbs), len(verb_pool) // k)) > 0
            if asks_objects and asks_verbs:
                yes = sorted(present - {"person"})
                no = _draw(rng, set(all_objects) - present - {"person"}, k * len(yes))
                for obj, a in [(o, "yes") for o in yes] + [(o, "no") for o in no]:
                    prompt = (f"Are there {object_name(obj)} in the image?" if obj in ("skis", "scissors")
                              else f"Is there {object_with_article(obj)} in the image?")
                    drafts.append((prompt, a, None, obj, None, [], (), 0))
        elif qset == "yn_ko":
            negatives = {h for h in real if row[h] == -1}
            for h in sorted(positives | negatives):
                drafts.append((_yn_obj(verbs[h], objects[h]), "yes" if h in positives else "no", verbs[h],
                               objects[h], h, [], (), 0))
        else:
            raise KeyError(qset)
        for prompt, answer, verb, obj, hoi, options, group_key, rotation in drafts:
            question_id = _hash(dataset, qset, image, prompt, options, answer)
            rows.append({
                "question_id": question_id, "dataset": dataset, "qset": qset, "image_id": image_id,
                "image": image, "verb": verb, "object": obj, "hoi_id": hoi, "prompt": prompt, "options": options,
                "answer": answer, "group_id": _hash(dataset, qset, image, *group_key) if options else question_id,
                "rotation": rotation, "rare": hoi is not None and hoi in rare, "common": verb in common_verbs,
            })
    frame = pd.DataFrame(rows)
    frame["hoi_id"] = frame["hoi_id"].astype("Int64")
    return frame
