"""CharadesEgo's question sets (paper "Egocentric and Exocentric Views"; docs/questions.md): one question per
third-person action, asked on the frame of each view, with the benchmark's YN and MC protocols.
The videos, frames and annotations are read by :mod:`verbmirage.data.charades`.
"""

from __future__ import annotations

import pandas as pd

from verbmirage.benchmark.sampling import Draft, circular, content_hash, draw, named_rng
from verbmirage.data.charades import CharadesVocabulary

_SUBJECT = "someone is "


# Class texts that are not gerund phrases besides the "Someone is ..." sentences (c121 in the real list).
_GERUND_FIXES = {"Wash a dish/dishes": "Washing a dish/dishes"}


def action_phrase(class_text: str) -> str:
    """A class as the gerund phrase questions use: "Opening a door" -> "opening a door".

    Eleven real classes are sentences ("Someone is laughing", c146-c156; also
    c115 and c133): their subject goes, so the question reads "Is someone
    laughing?", not "Is someone someone is laughing?".
    """
    text = _GERUND_FIXES.get(class_text.strip(), class_text.strip())
    if text.lower().startswith(_SUBJECT):
        text = text[len(_SUBJECT):]
    return text[0].lower() + text[1:]


def action_option(class_text: str) -> str:
    """A class as an MC option spells it: the gerund phrase, capitalised ("Laughing", "Opening a door")."""
    phrase = action_phrase(class_text)
    return phrase[0].upper() + phrase[1:]


def build_charades_questions(frames: pd.DataFrame, vocabulary: CharadesVocabulary, qset: str,
                             seed: int = 0, mc_options: int = 4) -> pd.DataFrame:
    """``yn_{view}`` / ``mc_{view}``: one question per exo action, asked on that view's frame.

    YN: the action ("yes") and one class drawn from those whose object is in
    the frame but which are not happening ("no"), Yes:No about 1:1. MC: the
    action and ``mc_options - 1`` such classes, in every circular rotation;
    skipped when fewer are available. Draws depend only on (seed, pair,
    action), so both views get the same questions.
    """
    kind, view = qset.split("_")
    rows = []
    for frame in frames[frames.view == view].itertuples():
        rng = named_rng(seed, kind, frame.frame_id.rsplit("_", 1)[0])  # same stream for both views
        objects = {vocabulary.object_of(c) for c in frame.positives}
        pool = [c for c in vocabulary.classes if vocabulary.object_of(c) in objects and c not in frame.positives]
        verb, obj = (vocabulary.verbs[vocabulary.mapping[frame.action][1]],
                     vocabulary.objects[vocabulary.mapping[frame.action][0]])
        if kind == "yn":
            drafts = [Draft(f"Is someone {action_phrase(vocabulary.classes[c])}?", answer, verb, obj, int(c[1:]))
                      for c, answer in [(frame.action, "yes")] + [(c, "no") for c in draw(rng, pool, 1)]]
        else:
            if len(pool) < mc_options - 1:
                continue
            chosen = [frame.action] + draw(rng, pool, mc_options - 1)
            texts = [action_option(vocabulary.classes[c]) for c in chosen]
            drafts = circular(texts, 0, rng, Draft("", "", verb, obj, int(frame.action[1:])))
        for draft in drafts:
            question_id = content_hash("charadesego", qset, frame.image, draft.prompt, draft.options, draft.answer)
            rows.append({
                "question_id": question_id, "dataset": "charadesego", "qset": qset,
                "image_id": frame.frame_id, "image": frame.image, "verb": draft.verb, "object": draft.object,
                "hoi_id": draft.hoi_id, "prompt": draft.prompt,
                "options": draft.options, "answer": draft.answer,
                "group_id": content_hash("charadesego", qset, frame.image, *draft.group_key) if draft.options else question_id,
                "rotation": draft.rotation, "rare": False, "common": False,
            })
    table = pd.DataFrame(rows)
    if table.empty:
        raise ValueError(f"charadesego question set '{qset}' is empty")
    table["hoi_id"] = table["hoi_id"].astype("Int64")
    duplicated = table.question_id.duplicated()
    if duplicated.any():
        raise AssertionError(f"duplicate question ids in {qset}: frames {table.image_id[duplicated].head().tolist()}")
    return table


def training_frequencies(videos: pd.DataFrame, vocabulary: CharadesVocabulary) -> pd.DataFrame:
    """The language prior's knowledge for CharadesEgo: how often a class happens when its object does.

    Same columns as :func:`verbmirage.models.baselines.training_frequencies`
    (``phrase`` is the class as the MC options spell it, :func:`action_option`).
    """
    rows = []
    happened = [{c for c, _, _ in actions} for actions in videos.actions]
    for c, text in vocabulary.classes.items():
        obj = vocabulary.object_of(c)
        with_object = [classes for classes in happened if any(vocabulary.object_of(x) == obj for x in classes)]
        rows.append(("hoi", vocabulary.verbs[vocabulary.mapping[c][1]], vocabulary.objects[obj], action_option(text),
                     sum(c in classes for classes in with_object), len(with_object)))
    table = pd.DataFrame(rows, columns=["kind", "verb", "object", "phrase", "positives", "total"])
    table["p_yes"] = (table.positives + 1) / (table.total + 2)
    return table
