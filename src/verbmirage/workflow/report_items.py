"""Where each result sits in the HTML report (``snakemake --report``, ``verbmirage report``).

Every file the rules mark for the report has one :class:`ReportItem` here (:data:`REPORT_ITEMS`): its category,
its place in the paper's order, the paper's item it reproduces and its caption file under ``report/``. The
rules take all of it from :func:`report_options`, so the report's order is written once, here. Inside a
category the report sorts its results by their first label, so that label is the paper's order (``01``,
``02``, ...; a figure drawn in parts ``03a``, ``03b``; one whose number of pages depends on the config, as
Fig. 10's, has one entry with ``{part}`` for the page's letter). The report's own pages (its landing headline,
the run's facts): :mod:`verbmirage.workflow.report_pages`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

TABLES, FIGURES, ANALYSES, RUN = "Paper tables", "Paper figures", "Analyses", "Run facts"


@dataclass(frozen=True)
class ReportItem:
    category: str
    rank: int  # its place in the category: the paper's order
    paper: str  # the paper's item it reproduces ("Table 1", "Fig. 4(b)", "App. A"), or "ours"
    shows: str
    caption: str  # its caption file in report/
    part: str = ""  # a figure drawn in parts: this part's letter

    @property
    def labels(self) -> dict[str, str]:
        """The report's columns for it; the first sorts the category (string order, hence the zeros; a part's
        letter after its figure's number)."""
        return {"no.": f"{self.rank:02d}{self.part}", "paper": self.paper, "shows": self.shows}


#: Every file the report shows, by the end of its path inside the results folder.
REPORT_ITEMS: dict[str, ReportItem] = {
    "tables/table1.html": ReportItem(TABLES, 1, "Table 1", "YN and MC questions, with and without the object named",
                                     "table.rst"),
    "tables/table2.html": ReportItem(TABLES, 2, "Table 2", "clean vs distorted images; error consistency",
                                     "table.rst"),
    "tables/table3.html": ReportItem(TABLES, 3, "Table 3", "majority-vote ensembles vs their members", "table.rst"),
    "tables/table4.html": ReportItem(TABLES, 4, "Table 4", "CharadesEgo: egocentric vs exocentric views",
                                     "table.rst"),
    "tables/table5.html": ReportItem(TABLES, 5, "Table 5", "mitigation methods", "table5_mitigation.rst"),
    "tables/table6.html": ReportItem(TABLES, 6, "Table 6", "overlap of the influential object sets",
                                     "table6_object_reliance.rst"),
    "tables/table7.html": ReportItem(TABLES, 7, "Table 7", "verbs' influence on the answers",
                                     "table7_verb_influence.rst"),
    "tables/table8.html": ReportItem(TABLES, 8, "Table 8", "decoding strategies", "table8_decoding.rst"),
    "benchmark/hico/counts.html": ReportItem(TABLES, 9, "App. A", "HICO question counts", "counts.rst"),
    "benchmark/charadesego/counts.html": ReportItem(TABLES, 10, "App. A", "CharadesEgo question counts",
                                                    "counts.rst"),
    "figures/fig1_object_vs_verb.png": ReportItem(FIGURES, 1, "Fig. 1", "object vs verb hallucination",
                                                  "fig1_object_vs_verb.rst"),
    "figures/fig3a_rare_common.png": ReportItem(FIGURES, 3, "Fig. 3", "rare vs common verbs: answer No",
                                                "fig3_rare_common.rst", "a"),
    "figures/fig3b_rare_common.png": ReportItem(FIGURES, 3, "Fig. 3", "rare vs common verbs: answer Yes (ours)",
                                                "fig3_rare_common.rst", "b"),
    "figures/fig4b_error_consistency.png": ReportItem(FIGURES, 4, "Fig. 4(b)", "error consistency: objects vs verbs",
                                                      "fig4b_error_consistency.rst"),
    "figures/fig5_ego_exo.png": ReportItem(FIGURES, 5, "Fig. 5", "egocentric vs exocentric (MC)", "fig5_ego_exo.rst"),
    "figures/fig6a_ambiguity.png": ReportItem(FIGURES, 6, "Fig. 6", "ambiguous vs unambiguous images: any rule",
                                              "fig6_ambiguity.rst", "a"),
    "figures/fig6b_ambiguity.png": ReportItem(FIGURES, 6, "Fig. 6", "ambiguous vs unambiguous: size ratio, crowd",
                                              "fig6_ambiguity.rst", "b"),
    "figures/fig6c_ambiguity.png": ReportItem(FIGURES, 6, "Fig. 6",
                                              "ambiguous vs unambiguous: occlusion, invisible HOI",
                                              "fig6_ambiguity.rst", "c"),
    "figures/fig7_attention.png": ReportItem(FIGURES, 7, "Fig. 7", "key-area and verb attention",
                                             "attention_fig7.rst"),
    "figures/fig8_attention.png": ReportItem(FIGURES, 8, "Fig. 8", "visual token attention", "attention_fig8.rst"),
    "figures/fig9_uncertainty.png": ReportItem(FIGURES, 9, "Fig. 9", "token uncertainty", "uncertainty_fig9.rst"),
    "figures/fig10{part}_fov.png": ReportItem(FIGURES, 10, "Fig. 10", "field of view and uncertainty",
                                              "fov_fig10.rst"),
    "figures/fig11_known_object_ap.png": ReportItem(FIGURES, 11, "Fig. 11", "Known-Object AP per HOI vs CLIP",
                                                    "known_object_fig11.rst"),
    "figures/fig12_uncertainty.png": ReportItem(FIGURES, 12, "Fig. 12", "token uncertainty, second model",
                                                "uncertainty_fig12.rst"),
    "figures/fig13_attention.png": ReportItem(FIGURES, 13, "Fig. 13", "visual token attention, more sets",
                                              "attention_fig13.rst"),
    "figures/fig14_attention.png": ReportItem(FIGURES, 14, "Fig. 14", "visual token attention, second model",
                                              "attention_fig14.rst"),
    "figures/fig15_object_reliance.png": ReportItem(FIGURES, 15, "Fig. 15", "YN accuracy with vs without the object",
                                                    "fig15_object_reliance.rst"),
    "analysis/attention_summary.html": ReportItem(ANALYSES, 1, "Figs. 7, 8, 13, 14", "attention: the numbers",
                                                  "attention_summary.rst"),
    "tables/fov.html": ReportItem(ANALYSES, 2, "Fig. 10", "field of view: the numbers", "fov_table.rst"),
    "analysis/vcd_divergence.html": ReportItem(ANALYSES, 3, "VCD (mitigation)", "VCD divergence: KL = 0 and flips",
                                               "vcd_divergence_table.rst"),
    "figures/vcd_divergence.png": ReportItem(ANALYSES, 4, "VCD (mitigation)", "VCD divergence: the KL distribution",
                                             "vcd_divergence.rst"),
    "report/run_facts.html": ReportItem(RUN, 1, "ours", "config, data roots, models, versions", "run_facts.rst"),
}


def report_item(path: str | Path) -> ReportItem:
    """The :class:`ReportItem` of a file marked for the report; a KeyError naming it and :data:`REPORT_ITEMS`."""
    text = Path(path).as_posix()
    found = [item for end, item in REPORT_ITEMS.items() if text == end or text.endswith(f"/{end}")]
    for end, item in REPORT_ITEMS.items():  # a page of a figure with a page per few models: {part} its letter
        page = re.fullmatch(rf"(?:.*/)?{re.escape(end).replace(re.escape('{part}'), '(?P<part>[a-z])')}", text)
        if "{part}" in end and page:
            found.append(replace(item, part=page.group("part")))
    if not found:
        raise KeyError(f"{path} is marked for the report but has no entry in verbmirage.workflow.report_items."
                       "REPORT_ITEMS (its category, its place in the paper's order, its caption)")
    return found[0]


def is_reported(path: str | Path) -> bool:
    """Whether the report shows ``path`` (it has a :data:`REPORT_ITEMS` entry)."""
    try:
        report_item(path)
    except KeyError:
        return False
    return True


def report_options(path: str | Path, captions: str = "../report") -> dict:
    """The keyword arguments of Snakemake's ``report()`` for ``path``: category, labels, caption (in
    ``captions``, relative to the rule files). A path with wildcards (``benchmark/{dataset}/counts.html``)
    stands for every item its pattern matches; its labels are then picked per job from its wildcards."""
    text = Path(path).as_posix()
    if "{" not in text:
        item = report_item(text)
        return {"category": item.category, "labels": item.labels, "caption": f"{captions}/{item.caption}"}
    parts = text.split("/")

    def fits(end: str) -> bool:  # the pattern's last path parts, each {wildcard} any one folder name, are end
        tail = "/".join(parts[-len(end.split("/")):])
        return re.fullmatch(re.sub(r"\\{\w+\\}", "[^/]+", re.escape(tail)), end) is not None

    matches = [item for end, item in REPORT_ITEMS.items() if fits(end)]
    if not matches:
        raise KeyError(f"{path} is marked for the report but matches no entry of verbmirage.workflow.report_items."
                       "REPORT_ITEMS")
    item = matches[0]

    def labels(wildcards) -> dict[str, str]:
        return report_item(text.format(**dict(wildcards.items()))).labels

    return {"category": item.category, "labels": labels, "caption": f"{captions}/{item.caption}"}


__all__ = ["REPORT_ITEMS", "ReportItem", "report_item", "is_reported", "report_options"]
