"""The page every figure is laid out for, and the one way a figure is saved (PNG, PDF and SVG).

Every figure the workflow draws goes through here:

- **Drawn at the size it prints**: :data:`PAGE_WIDTH` inches wide (a two-column paper's full text width,
  178 mm), so a font of :data:`FONT` points is that size on the page; the PNG at :data:`DPI` is
  ``PAGE_WIDTH x DPI`` = 1,750 px wide. No text is smaller than :data:`FONT` (8 pt); panel titles are
  :data:`TITLE`, the figure's heading :data:`HEADING`.
- **At most three panels a row**: :func:`page_figure` lays ``n`` panels out in a grid of at most
  :data:`MAX_COLUMNS` columns (fewer where a panel needs the width, :func:`columns_for`); more panels make
  more rows, never a wider figure.
- **At most a page tall**: no figure is taller than :data:`MAX_HEIGHT_RATIO` times its width (9.1 in, a
  page's text block at text width; a report viewer shows it whole). A figure with more rows than that is
  drawn as parts or pages (Figs. 3, 6 and 10: ``fig6a``, ``fig6b``, ...; :func:`rows_per_page`, :func:`part_names`);
  where a figure's rows depend on its data, :func:`page_figure` makes its panels lower to fit, down to
  :data:`MIN_PANEL_HEIGHT`.
- **Small samples named**: :func:`n_label` gives ``"n=12"`` for a count under :data:`SMALL_N`, printed on
  the bar or panel it belongs to.
- **Saved for a paper, the same bytes every run**: :func:`save_figure` writes the PNG and, beside it, a PDF and
  an SVG (:func:`companion_paths`). Matplotlib dates PDF and SVG files and salts SVG ids at random; here
  neither, so the same data gives byte-identical files and a killed and resumed run leaves the tree an
  uninterrupted one does (docs/faults.md).

:func:`layout_problems` measures a drawn figure against these rules (the tests use it on every figure).
matplotlib is imported inside the functions, on purpose: importing an analysis module stays cheap.
"""

from __future__ import annotations

import contextlib
import logging
import math
import textwrap
from collections.abc import Iterator
from pathlib import Path

from verbmirage.core.paths import atomic_path

PAGE_WIDTH = 7.0  # inches: a two-column paper's full text width (178 mm)
DPI = 250  # 7.0 in x 250 = 1,750 px (at most about 1,800 px wide)
MAX_WIDTH_PX = 1800
MAX_COLUMNS = 3
MAX_HEIGHT_RATIO = 1.3  # height / width: a page's text block (9.1 in tall at 7 in wide)
MAX_HEIGHT = MAX_HEIGHT_RATIO * PAGE_WIDTH
MIN_PANEL_HEIGHT = 1.6  # inches: a panel lowered to fit the page keeps at least this (ticks, a legend, a title)
HEADING_LINES = 6  # the heading lines a page is planned for (title, notes, skipped models)
FONT = 8  # points at print size: ticks, labels, legends, annotations
TITLE = 9  # a panel's title
HEADING = 10  # the figure's heading
SMALL_N = 30  # a count under this is printed ("n=12") where it is drawn
COMPANIONS = (".pdf", ".svg")  # saved beside each PNG
SVG_SALT = "verbmirage"  # SVG element ids hash with this instead of a random uuid
STYLE = {
    "font.size": FONT,
    "axes.titlesize": TITLE,
    "axes.labelsize": FONT,
    "xtick.labelsize": FONT,
    "ytick.labelsize": FONT,
    "legend.fontsize": FONT,
    "legend.title_fontsize": FONT,
    "figure.titlesize": HEADING,
    "svg.hashsalt": SVG_SALT,
    "pdf.fonttype": 42,  # TrueType in the PDF (journals refuse Type 3 fonts)
}
# characters per inch of a line at ``points`` (DejaVu Sans averages about half an em a character)
_CHARACTERS_PER_INCH = 72 / (0.55 * FONT)  # a little wide: headings never run over


@contextlib.contextmanager
def page_style() -> Iterator[None]:
    """Fonts and save settings of :data:`STYLE` while a figure is drawn and saved (matplotlib reads most of
    them when an artist is made, so the whole drawing goes inside)."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        yield


def grid(n_panels: int, columns: int = MAX_COLUMNS) -> tuple[int, int]:
    """(rows, columns) for ``n_panels`` panels, at most ``columns`` and :data:`MAX_COLUMNS` a row."""
    columns = max(1, min(columns, MAX_COLUMNS, n_panels))
    return max(1, math.ceil(n_panels / columns)), columns


def columns_for(n_panels: int, groups: int, group_width: float = 0.5, margin: float = 0.7) -> int:
    """The most columns (at most :data:`MAX_COLUMNS` and ``n_panels``) whose panels still give each of
    ``groups`` x positions (bar groups, boxes) ``group_width`` inches, ``margin`` inches left for the y axis."""
    for columns in range(min(MAX_COLUMNS, max(1, n_panels)), 1, -1):
        if PAGE_WIDTH / columns - margin >= groups * group_width:
            return columns
    return 1


def wrap(text: str, width: float = PAGE_WIDTH, points: float = FONT) -> str:
    """``text`` wrapped line by line to ``width`` inches at ``points`` (a heading or note that fits the page)."""
    per_line = max(20, int(width * _CHARACTERS_PER_INCH * FONT / points))
    return "\n".join(wrapped for line in text.splitlines() for wrapped in (textwrap.wrap(line, per_line) or [""]))


def heading_height(lines: int) -> float:
    """Inches a heading of ``lines`` lines takes above the panels (with the figure's margin)."""
    return 0.2 + lines * HEADING * 1.35 / 72


def rows_per_page(panel_height: float, heading_lines: int = HEADING_LINES) -> int:
    """How many rows of panels ``panel_height`` inches tall fit a page (:data:`MAX_HEIGHT`) under a heading of
    ``heading_lines`` lines; at least one."""
    return max(1, int((MAX_HEIGHT - heading_height(heading_lines)) // panel_height))


def part_names(name: str, parts: int) -> list[str]:
    """The files of a figure drawn in ``parts`` parts: ``fig10_fov`` -> ``fig10a_fov``, ``fig10b_fov``, ...
    (the letter after the figure's number, so the report lists them in order). At most 26 parts."""
    number, _, rest = name.partition("_")
    if not 1 <= parts <= 26:
        raise ValueError(f"{name}: {parts} parts; a figure is drawn in 1 to 26 parts")
    return [f"{number}{chr(ord('a') + part)}_{rest}" if rest else f"{number}{chr(ord('a') + part)}"
            for part in range(parts)]


def page_figure(n_panels: int, *, columns: int = MAX_COLUMNS, panel_height: float = 2.4, heading: str = "",
                sharey: bool = False):
    """A figure :data:`PAGE_WIDTH` wide with ``n_panels`` axes in a grid of at most ``columns`` (and
    :data:`MAX_COLUMNS`) a row, constrained layout, ``heading`` wrapped above; the grid's unused cells are
    hidden. Where the rows would make it taller than :data:`MAX_HEIGHT`, the panels are lowered to fit
    (not below :data:`MIN_PANEL_HEIGHT`). Returns (figure, axes in reading order). Call inside
    :func:`page_style`."""
    from matplotlib.figure import Figure

    rows, columns = grid(n_panels, columns)
    heading = wrap(heading, points=HEADING) if heading else ""
    above = heading_height(heading.count("\n") + 1 if heading else 0)
    panel_height = max(min(panel_height, (MAX_HEIGHT - above) / rows), min(panel_height, MIN_PANEL_HEIGHT))
    figure = Figure(figsize=(PAGE_WIDTH, rows * panel_height + above), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False, sharey=sharey)
    for axis in axes.flat[n_panels:]:
        axis.set_visible(False)
    if heading:
        figure.suptitle(heading, fontsize=HEADING)
    return figure, list(axes.flat[:max(1, n_panels)])


def text_width(text: str, points: float = FONT) -> float:
    """About how wide (inches) the longest line of ``text`` sets at ``points``: 0.6 em a character, the width
    of mixed-case names with digits (``Qwen2-VL-7B`` sets at 0.62 em; at 0.5 em, a paper name under a slug ran
    into its neighbour's tick label)."""
    return max((len(line) for line in str(text).splitlines()), default=0) * 0.6 * points / 72


def axis_width(axis) -> float:
    """The panel's width in inches (its grid cell before the layout runs)."""
    return axis.get_position().width * axis.get_figure().get_figwidth()


def tick_rotation(labels, axis) -> int:
    """The smallest angle (0, 30, 45 or 90 degrees) at which ``labels`` side by side, each in its share of the
    panel's width, do not run into each other (set them with ``ha="right", rotation_mode="anchor"``)."""
    import math as _math

    room = axis_width(axis) / max(1, len(labels))
    if max((text_width(label) for label in labels), default=0) <= 0.95 * room:
        return 0
    # the lines' height with a third more for clearance: a two-line name (a slug over its paper name) at exactly
    # its height's distance still read as touching its neighbour
    height = max((label.count("\n") + 1 for label in labels), default=1) * FONT * 1.2 / 72 * 4 / 3
    return next((angle for angle in (30, 45) if room * _math.sin(_math.radians(angle)) >= height), 90)


def fit_title(axis, text: str) -> None:
    """``text`` as the panel's title, wrapped to the panel's width."""
    axis.set_title(wrap(text, axis_width(axis), TITLE), fontsize=TITLE)


def legend_columns(labels, axis, handle: float = 0.45) -> int:
    """How many legend entries (``labels``, each after a ``handle`` inches wide) fit a row under ``axis``."""
    entry = max((text_width(label) for label in labels), default=0) + handle
    return max(1, min(len(labels), int(axis_width(axis) // entry) if entry else 1))


def legend_below(axis, handles, labels_rotation: int = 0, **options):
    """A legend under ``axis``, clear of its x tick labels (their height estimated from their text and
    ``labels_rotation``) and of its x label, as many entries a row as fit (:func:`legend_columns`)."""
    import math as _math

    from matplotlib.transforms import offset_copy

    labels = [tick.get_text() for tick in axis.get_xticklabels()]
    angle = _math.radians(labels_rotation)
    height = max((text_width(label) * _math.sin(angle) + (label.count("\n") + 1) * FONT * 1.2 / 72 * _math.cos(angle)
                  for label in labels), default=0.0)
    if axis.get_xlabel():
        height += FONT * 1.4 / 72
    below = offset_copy(axis.transAxes, fig=axis.get_figure(), y=-(height + 0.12), units="inches")
    return axis.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below,
                       ncol=legend_columns([h.get_label() for h in handles], axis), frameon=False, **options)


def n_label(n) -> str:
    """``"n=12"`` where a count is small (under :data:`SMALL_N`), else ``""``."""
    try:
        value = int(n)
    except (TypeError, ValueError):
        return ""
    return f"n={value}" if value < SMALL_N else ""


def companion_paths(path: str | Path) -> list[Path]:
    """The PDF and SVG saved beside a figure's PNG (the paths the Snakemake rules declare)."""
    path = Path(path)
    if path.suffix != ".png":
        raise ValueError(f"{path}: a figure is named by its PNG (.png), got '{path.suffix}'")
    return [path.with_suffix(suffix) for suffix in COMPANIONS]


def save_figure(figure, path: str | Path) -> list[Path]:
    """Write ``figure`` to ``path`` (PNG at :data:`DPI`) and its PDF and SVG beside it, without dates or random
    ids: the same figure gives the same bytes. Returns the three paths."""
    import matplotlib

    path = Path(path)
    paths = [path, *companion_paths(path)]
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {".png": None, ".pdf": {"CreationDate": None}, ".svg": {"Date": None}}
    subsetter = logging.getLogger("fontTools")  # reports every table it prunes when the PDF embeds the fonts
    level = subsetter.level
    subsetter.setLevel(max(level, logging.WARNING))
    try:
        with matplotlib.rc_context(STYLE):
            for target in paths:
                with atomic_path(target) as tmp:
                    figure.savefig(tmp, format=target.suffix[1:], dpi=DPI, metadata=metadata[target.suffix])
    finally:
        subsetter.setLevel(level)
    return paths


def _visible_texts(artist) -> Iterator:
    from matplotlib.text import Text

    if not artist.get_visible():
        return
    if isinstance(artist, Text) and artist.get_text().strip():
        yield artist
    for child in artist.get_children():
        yield from _visible_texts(child)


def smallest_font(figure) -> float:
    """The smallest font (points) of any visible text of a drawn ``figure`` (inf when it has none)."""
    return min((text.get_fontsize() for text in _visible_texts(figure)), default=math.inf)


def panels_per_row(figure) -> list[int]:
    """How many visible panels each row of a drawn ``figure`` holds, top row first (rows by their top edge)."""
    rows: dict[float, set[float]] = {}
    for axis in figure.axes:
        if axis.get_visible():
            box = axis.get_position()
            rows.setdefault(round(box.y1, 2), set()).add(round(box.x0, 2))
    return [len(rows[top]) for top in sorted(rows, reverse=True)]


def layout_problems(figure, dpi: float = DPI) -> list[str]:
    """What breaks the page rules in a drawn ``figure``: wider than :data:`MAX_WIDTH_PX` at ``dpi``, taller than
    :data:`MAX_HEIGHT_RATIO` times its width, more than :data:`MAX_COLUMNS` panels in a row, a font under
    :data:`FONT` points. Empty when it fits."""
    problems = []
    width, height = figure.get_size_inches()
    if width * dpi > MAX_WIDTH_PX:
        problems.append(f"{width * dpi:.0f} px wide (at most {MAX_WIDTH_PX})")
    if height > MAX_HEIGHT_RATIO * width + 1e-9:
        problems.append(f"{height / width:.2f} times as tall as wide (at most {MAX_HEIGHT_RATIO})")
    widest = max(panels_per_row(figure), default=0)
    if widest > MAX_COLUMNS:
        problems.append(f"{widest} panels in a row (at most {MAX_COLUMNS})")
    small = smallest_font(figure)
    if small < FONT:
        texts = sorted({t.get_text()[:40] for t in _visible_texts(figure) if t.get_fontsize() < FONT})
        problems.append(f"a {small:g} pt font (at least {FONT}): {texts[:5]}")
    return problems
