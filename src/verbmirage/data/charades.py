"""CharadesEgo (v1): annotations, paired ego/exo videos, frames, and a mini demo copy.

Layout (the real archives): ``CharadesEgo/CharadesEgo_v1_{train,test}.csv``
(columns ``id, subject, scene, quality, relevance, verified, script, objects,
descriptions, actions, length, egocentric, charades_video``; ``actions`` like
``c092 11.90 21.20;c147 0.00 12.60``), the class files
``Charades_v1_classes.txt`` (``c000 Holding some clothes``),
``Charades_v1_objectclasses.txt`` (``o012 door``),
``Charades_v1_verbclasses.txt`` (``v012 open``), ``Charades_v1_mapping.txt``
(``c008 o012 v012``), and videos ``CharadesEgo_v1_480/<id>.mp4`` where the
third-person ``ABCDE`` pairs with the egocentric ``ABCDEEGO``. Frames are read
with PyAV. The two views are separate recordings of one script, each row with its
own annotated intervals: an ego frame is the middle of the egocentric row's own
interval of the action, or where that row does not annotate it, the exo time
scaled by the ratio of the lengths (:func:`frame_table`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from verbmirage.core.paths import inside, replace_entry, safe_name, safe_relative_name

CSV_COLUMNS = ["id", "subject", "scene", "quality", "relevance", "verified", "script", "objects",
               "descriptions", "actions", "length", "egocentric", "charades_video"]
EGO_SUFFIX = "EGO"


@dataclass(frozen=True)
class CharadesVocabulary:
    """Action classes and their (verb, object) decomposition."""

    classes: dict[str, str]  # c008 -> "Opening a door"
    objects: dict[str, str]  # o012 -> "door"
    verbs: dict[str, str]  # v012 -> "open"
    mapping: dict[str, tuple[str, str]]  # c008 -> (o012, v012)

    def object_of(self, action: str) -> str:
        return self.mapping[action][0]


def _id_text_file(path: Path) -> dict[str, str]:
    entries = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            key, _, text = line.strip().partition(" ")
            if not text:
                raise ValueError(f"{path}:{number}: expected '<id> <text>', got {line!r}")
            entries[key] = text
    return entries


def load_vocabulary(annotations: str | Path) -> CharadesVocabulary:
    """Read the four class files from the ``CharadesEgo`` annotation folder."""
    folder = Path(annotations)
    mapping = {}
    for number, line in enumerate((folder / "Charades_v1_mapping.txt").read_text().splitlines(), 1):
        parts = line.split()
        if parts:
            if len(parts) != 3:
                raise ValueError(f"{folder / 'Charades_v1_mapping.txt'}:{number}: expected 'cXXX oXXX vXXX'")
            mapping[parts[0]] = (parts[1], parts[2])
    return CharadesVocabulary(
        classes=_id_text_file(folder / "Charades_v1_classes.txt"),
        objects=_id_text_file(folder / "Charades_v1_objectclasses.txt"),
        verbs=_id_text_file(folder / "Charades_v1_verbclasses.txt"),
        mapping=mapping,
    )


def parse_actions(field, where: str = "actions") -> list[tuple[str, float, float]]:
    """``"c092 11.90 21.20;c147 0.00 12.60"`` -> [("c092", 11.9, 21.2), ...]; empty -> []."""
    if field is None or (isinstance(field, float) and np.isnan(field)) or not str(field).strip():
        return []
    actions = []
    for item in str(field).split(";"):
        parts = item.split()
        if len(parts) != 3:
            raise ValueError(f"{where}: cannot read action {item!r} (expected 'cXXX start end')")
        safe_name(parts[0], f"{where}: action class")  # it becomes part of a frame's file name
        actions.append((parts[0], float(parts[1]), float(parts[2])))
    return actions


def load_split(annotations: str | Path, split: str) -> pd.DataFrame:
    """One CSV as a table; ``actions`` parsed into (class, start, end) tuples."""
    path = Path(annotations) / f"CharadesEgo_v1_{split}.csv"
    table = pd.read_csv(path, dtype={"id": str})
    missing = [c for c in CSV_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: missing columns {missing}")
    for row, video in enumerate(table["id"]):  # ids become video and frame file names
        safe_name(video, f"{path} row {row + 2}, column 'id'")
    table["actions"] = [parse_actions(a, f"{path} row {i + 2}") for i, a in enumerate(table["actions"])]
    return table


def video_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """Third-person ``ABCDE`` rows next to their egocentric ``ABCDEEGO`` rows (both must exist): ``actions`` are the
    third-person row's intervals, ``ego_actions`` the egocentric row's own."""
    by_id = table.set_index("id")
    pairs = []
    for video in table.id:
        if video.endswith(EGO_SUFFIX) or f"{video}{EGO_SUFFIX}" not in by_id.index:
            continue
        ego = f"{video}{EGO_SUFFIX}"
        pairs.append({"exo": video, "ego": ego, "exo_length": float(by_id.at[video, "length"]),
                      "ego_length": float(by_id.at[ego, "length"]), "actions": by_id.at[video, "actions"],
                      "ego_actions": by_id.at[ego, "actions"]})
    return pd.DataFrame(pairs)


def ego_time(exo_seconds: float, exo_length: float, ego_length: float) -> float:
    """The exo time scaled by the length ratio: the ego frame's time where the egocentric row does not annotate
    the action itself."""
    return exo_seconds * ego_length / exo_length


#: How a frame's time was chosen (column ``time_from`` of the frame table): the middle of the view's own annotated
#: interval of the action (every exo frame; an ego frame whose row annotates the action), or the exo time scaled.
OWN_INTERVAL, SCALED_EXO = "own_interval", "scaled_exo"


def ego_moment(action: str, exo_moment: float, pair) -> tuple[float, str]:
    """(seconds, :data:`OWN_INTERVAL` or :data:`SCALED_EXO`): the ego frame of the exo frame at ``exo_moment``.

    The middle of the egocentric row's own interval of ``action`` (of several, the one whose middle is nearest
    the scaled exo time: a class done twice keeps its order), else the scaled exo time (:func:`ego_time`).
    """
    scaled = ego_time(exo_moment, pair.exo_length, pair.ego_length)
    middles = [(start + end) / 2 for c, start, end in getattr(pair, "ego_actions", None) or [] if c == action]
    if not middles:
        return scaled, SCALED_EXO
    return min(middles, key=lambda middle: (abs(middle - scaled), middle)), OWN_INTERVAL


def read_frame(video: str | Path, seconds: float) -> Image.Image:
    """The decoded frame shown at ``seconds`` (the last frame if the video is shorter)."""
    return frame_at(video, seconds)[1]


def frame_at(video: str | Path, seconds: float) -> tuple[float, Image.Image]:
    """(presentation time, image) of the frame on screen at ``seconds``."""
    import av

    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        container.seek(max(0, int(seconds / stream.time_base) - 1), stream=stream, backward=True, any_frame=False)
        chosen = None
        for frame in container.decode(stream):
            if chosen is not None and frame.time is not None and frame.time > seconds + 1e-6:
                break
            chosen = frame
        if chosen is None:
            raise ValueError(f"{video}: no frame could be decoded")
        return float(chosen.time), chosen.to_image()


# ---- the real class list and the demo copy --------------------------------------
def packaged_classes() -> pd.DataFrame:
    """The real 157 Charades classes c000-c156 (``class, object_id, object, verb_id, verb, text``).

    The texts of ``Charades_v1_classes.txt`` with each class's object and verb
    from ``Charades_v1_mapping.txt``, ``_objectclasses.txt`` (o000 "None" for
    the 7 classes without an object) and ``_verbclasses.txt``, transcribed from
    public copies of those files (``docs/questions.md``). The demo writes them
    back in the real format, so it asks the real class texts.
    """
    from importlib import resources

    with resources.files("verbmirage.data").joinpath("charades_v1_classes.tsv").open() as handle:
        return pd.read_csv(handle, sep="\t", dtype=str, keep_default_na=False)


# The demo's videos draw their actions from these real classes (objects with several classes each, so YN
# and MC negatives exist) and always include classes written as sentences ("Someone is laughing").
DEMO_ACTIONS = ("c000", "c001", "c002", "c004", "c006", "c008", "c025", "c026", "c027", "c028", "c032", "c046",
                "c047", "c048", "c051", "c059", "c061", "c063", "c106", "c107", "c109", "c149", "c152", "c156")
DEMO_REPEATED_ACTION = "c149"  # "Someone is laughing", twice in the first video of each split (two intervals)


def _write_video(path: Path, seconds: float, fps: int, color: tuple[int, int, int], rng) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    frames = max(2, int(round(seconds * fps)))
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for index in range(frames):
            image = Image.new("RGB", (64, 48), color)
            x = int(index * 56 / frames)
            ImageDraw.Draw(image).rectangle((x, 10, x + 8, 40), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
            for packet in stream.encode(av.VideoFrame.from_image(image)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _demo_ego_intervals(intervals: list[tuple[str, float, float]], video: int, exo_length: float,
                        ego_length: float) -> list[tuple[str, float, float]]:
    """The demo's egocentric row: the same script's actions in the ego recording's own time (the exo interval
    scaled), except its first action, which odd videos do not annotate (their ego frame falls back to the scaled
    time) and even ones annotate half a second off the scaled interval (their ego frame is not at the scaled
    time)."""
    own = []
    for k, (action, start, end) in enumerate(intervals):
        start, end = ego_time(start, exo_length, ego_length), ego_time(end, exo_length, ego_length)
        if k == 0 and video % 2:
            continue
        if k == 0:
            shift = 0.5 if end + 0.5 <= ego_length else -min(0.5, start)
            start, end = start + shift, end + shift
        own.append((action, start, end))
    return own


def write_demo_charadesego(root: str | Path, pairs: int = 12, seed: int = 0) -> Path:
    """A mini CharadesEgo under ``root``: ``CharadesEgo/`` annotations and ``CharadesEgo_v1_480/`` videos.

    The class files are the real ones (:func:`packaged_classes`); the first
    video of each split does one action twice, in two intervals. Each egocentric
    row has its own intervals (:func:`_demo_ego_intervals`): some ego frames come
    from them, some from the scaled exo time.
    """
    root = Path(root)
    annotations, videos = root / "CharadesEgo", root / "CharadesEgo_v1_480"
    annotations.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    classes = packaged_classes()
    (annotations / "Charades_v1_classes.txt").write_text("".join(f"{c} {t}\n" for c, t in zip(classes["class"], classes.text)))
    for kind in ("object", "verb"):
        entries = dict(sorted(zip(classes[f"{kind}_id"], classes[kind])))
        (annotations / f"Charades_v1_{kind}classes.txt").write_text("".join(f"{i} {n}\n" for i, n in entries.items()))
    (annotations / "Charades_v1_mapping.txt").write_text(
        "".join(f"{c} {o} {v}\n" for c, o, v in zip(classes["class"], classes.object_id, classes.verb_id))
    )
    object_of = dict(zip(classes["class"], classes.object))
    for split, count in (("train", pairs), ("test", pairs)):
        rows = []
        for n in range(count):
            video = f"{'TR' if split == 'train' else 'TE'}{n:03d}"
            exo_length = float(rng.uniform(4, 7))
            ego_length = round(exo_length * float(rng.uniform(0.8, 1.2)), 2)
            chosen = rng.choice(len(DEMO_ACTIONS), size=int(rng.integers(1, 4)), replace=False)
            intervals = []
            for c in sorted(DEMO_ACTIONS[int(i)] for i in chosen):
                start = round(float(rng.uniform(0, exo_length * 0.6)), 2)
                intervals.append((c, start, round(min(exo_length, start + float(rng.uniform(1, 3))), 2)))
            if n == 0:  # one class, two intervals: both must become their own frames and questions
                intervals += [(DEMO_REPEATED_ACTION, 0.2, 1.4), (DEMO_REPEATED_ACTION, 2.6, 3.8)]
            objects = ";".join(sorted({object_of[c] for c, _, _ in intervals} - {"None"}))
            ego_intervals = _demo_ego_intervals(intervals, n, exo_length, ego_length)
            for ego, length in ((False, exo_length), (True, ego_length)):
                rows.append({
                    "id": video + (EGO_SUFFIX if ego else ""), "subject": f"S{n:02d}", "scene": "Bedroom",
                    "quality": 6, "relevance": 7, "verified": "Yes", "script": "(demo) a person at home",
                    "objects": objects, "descriptions": "(demo)",
                    "actions": ";".join(f"{c} {start:.2f} {end:.2f}"
                                        for c, start, end in (ego_intervals if ego else intervals)),
                    "length": round(length, 2), "egocentric": "Yes" if ego else "No", "charades_video": video,
                })
                color = tuple(int(c) for c in rng.integers(40, 220, 3))
                _write_video(videos / f"{rows[-1]['id']}.mp4", length, 10, color, rng)
        pd.DataFrame(rows, columns=CSV_COLUMNS).to_csv(annotations / f"CharadesEgo_v1_{split}.csv", index=False)
    return root


# ---- frames and question sets (paper: Egocentric and Exocentric Images; Appendix A) ----
VIEWS = ("exo", "ego")


def frame_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """One row per (pair, exo action interval, view): the exo frame at the middle of the interval, the ego frame at
    the middle of the egocentric row's own interval of that action where it has one (:func:`ego_moment`; column
    ``time_from`` says which: :data:`OWN_INTERVAL` or :data:`SCALED_EXO`).

    Both views carry the exo video's labels, so ego and exo are asked about the
    same actions. ``positives`` are the classes whose interval holds the moment.
    A class done twice in a video (two intervals) gives two frames: the
    interval is part of the frame id and file name (``TE000_c149_0.20-1.40``),
    hence of every question id; an interval listed twice is one frame.
    """
    rows = []
    for pair in pairs.itertuples():
        for action, start, end in dict.fromkeys(pair.actions):
            moment = round((start + end) / 2, 3)
            positives = sorted({c for c, s, e in pair.actions if s <= moment <= e})
            name = f"{pair.exo}_{action}_{start:.2f}-{end:.2f}"
            for view in VIEWS:
                video = pair.exo if view == "exo" else pair.ego
                seconds, source = (moment, OWN_INTERVAL) if view == "exo" else ego_moment(action, moment, pair)
                rows.append({
                    "frame_id": f"{name}_{view}", "view": view, "video": video, "action": action,
                    "seconds": round(seconds, 3), "time_from": source, "positives": positives,
                    "image": f"frames/{view}/{name}.jpg",
                })
    return pd.DataFrame(rows)


def extract_frames(frames: pd.DataFrame, videos: str | Path, out_root: str | Path) -> pd.DataFrame:
    """Write every frame of ``frames`` as JPEG under ``out_root``; return ``frames`` with an ``error`` column."""
    from tqdm import tqdm

    videos, out_root = Path(videos), Path(out_root)
    errors = []
    for row in tqdm(frames.itertuples(), total=len(frames), desc="frames", unit="frame"):
        where = f"frame {row.frame_id}"
        target = out_root / safe_relative_name(row.image, f"{where}: image")
        video = videos / f"{safe_name(row.video, f'{where}: video')}.mp4"
        inside(out_root, target.parent, where)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            inside(videos, video, where)
            frame = read_frame(video, row.seconds)
            replace_entry(target, lambda tmp: frame.save(tmp, format="JPEG", quality=95))
            errors.append(None)
        except (OSError, ValueError) as error:
            errors.append(f"{row.video}.mp4 at {row.seconds}s: {type(error).__name__}: {error}")
    return frames.assign(error=errors)


