"""The demo's Snakemake report holds every figure and table the run made, and the paper figures exist; names from
a config show in a report as text and never run as script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from PIL import Image
from workflow_run import ARTIFACTS, REPO

from verbmirage.analysis.figure_layout import MAX_HEIGHT_RATIO, MAX_WIDTH_PX, companion_paths
from verbmirage.analysis.paper_figures import bar_values, fig1_object_vs_verb
from verbmirage.core.io import read_table
from verbmirage.core.schemas import METRICS
from verbmirage.data.demo import DemoSizes, write_demo_hico

pytestmark = pytest.mark.slow

PAPER_FIGURES = ["fig1_object_vs_verb.png", "fig3a_rare_common.png", "fig3b_rare_common.png",
                 "fig4b_error_consistency.png", "fig5_ego_exo.png", "fig6a_ambiguity.png", "fig6b_ambiguity.png",
                 "fig6c_ambiguity.png"]


def test_paper_figures_exist_and_note_where_the_numbers_come_from(demo_run):
    folder = demo_run / "results" / "figures"
    for name in PAPER_FIGURES:  # the demo has CharadesEgo (Fig. 5), HICO-DET boxes (Fig. 6), salt-and-pepper (4b)
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    log = (demo_run / "logs" / "paper_figures.log").read_text()
    config = yaml.safe_load((demo_run / "config.yaml").read_text())
    if any(entry.get("paper_name") for entry in config["models"].values()):
        assert "diamonds: the paper's number (beam5)" in log
    else:  # the demo's tiny models stand for no paper model
        assert "no paper marks: no model has a paper_name" in log
    assert any("tiny_llava" in line and "RANDOM weights" in line for line in log.splitlines())


def test_fig1_bars_are_the_demo_metric_rows(demo_run):
    metrics = read_table(demo_run / "results/metrics/metrics.parquet", METRICS)
    bars = {key.split("|", 1)[1]: value for key, value in bar_values(fig1_object_vs_verb(metrics)).items()}
    clean = metrics[(metrics.dataset == "hico") & (metrics.condition == "clean") & (metrics.subset == "all")
                    & (metrics.metric == "accuracy") & (metrics.variant == "default")]
    expected = clean.set_index(["model", "qset"]).value
    assert bars["tiny_llava|YN w/ object (yn_obj)"] == pytest.approx(100 * expected["tiny_llava", "yn_obj"])
    assert bars["blind_vote|YN verb only (yn_verb)"] == pytest.approx(100 * expected["blind_vote", "yn_verb"])
    assert bars["prior|object existence (obj_exist, not POPE)"] == pytest.approx(100 * expected["prior", "obj_exist"])


def test_every_figure_of_the_demo_fits_a_page_beside_its_pdf_and_svg(demo_run):
    figures = sorted((demo_run / "results" / "figures").glob("*.png"))
    assert len(figures) >= 15  # Figs. 1, 3, 4(b), 5-15 and the VCD divergence figure
    for png in figures:
        with Image.open(png) as image:
            assert image.size[0] <= MAX_WIDTH_PX, (png.name, image.size)
            assert image.size[1] <= MAX_HEIGHT_RATIO * image.size[0], (png.name, image.size)  # at most a page tall
        pdf, svg = companion_paths(png)
        assert pdf.read_bytes()[:5] == b"%PDF-", pdf.name
        assert b"<svg" in svg.read_bytes()[:1000], svg.name


@pytest.fixture(scope="module")
def demo_report(demo_run, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The demo's report as ``tools/demo.sh`` writes it (on the finished demo run: nothing left to run, then
    the Snakemake report), written once for this file, and the command's result."""
    report = tmp_path_factory.mktemp("report") / "report.html"
    result = subprocess.run(["bash", str(REPO / "tools" / "demo.sh"), "--directory", str(demo_run)],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "REPORT": str(report)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stderr  # the demo run is complete: demo.sh only wrote the report
    # the run's summary comes last, once the report is written: every model's headline, then the report to open
    summary = result.stderr[result.stderr.rindex("Verb Mirage: the run finished."):]
    assert summary.rstrip().splitlines()[-1].startswith(f"  report   {report} (open it in a browser"), summary
    table1 = pd.read_parquet(demo_run / "results/tables/table1.parquet")
    for model in set(table1.model[table1.source.eq("measured")]):  # every model, not the first five
        assert f"\n    {model} (" in summary, (model, summary)
    assert "Adding" not in summary and not result.stdout.strip()  # Snakemake's report lines are in logs/report.log
    assert "Report created." in (demo_run / "logs/report.log").read_text()
    return report, result


def test_report_holds_every_figure_and_table(demo_run, demo_report):
    figures = sorted((demo_run / "results" / "figures").glob("*.png"))
    tables = sorted((demo_run / "results" / "tables").glob("*.html"))
    assert {p.name for p in figures} >= set(PAPER_FIGURES)
    assert {"table1.html", "table2.html", "table3.html", "table4.html"} <= {p.name for p in tables}
    report, result = demo_report
    # docutils reports a caption it cannot read (e.g. |x| taken as a substitution) on stderr, and the report
    # then shows its error message instead of the text
    assert not re.findall(r"\((?:WARNING|ERROR|SEVERE)/\d\).*", result.stderr)
    html = report.read_text()
    missing = [p.name for p in figures + tables if p.name not in html]
    assert not missing, f"not in the report: {missing}"
    for text in ("Paper figures", "Paper tables", "Not reproduced", "Fig. 4(a)"):
        assert text in html, text


# ---- the report in a real browser ----------------------------------------------------------------------------
#: Debian's Chromium (apt-get install chromium; .ci/run installs it): playwright's own download cannot be reached
CHROMIUM = os.environ.get("VERBMIRAGE_CHROMIUM", "/usr/bin/chromium")


def expand_braces(text: str) -> list[str]:
    """``a{1,2}b`` -> ``a1b``, ``a2b`` (every ``{x,y}`` group; a group without a comma, a placeholder such as
    ``{qset}``, stays as it is)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", text)
    if not match:
        return [text]
    return [expanded for option in match.group(1).split(",")
            for expanded in expand_braces(text[: match.start()] + option + text[match.end() :])]


def readme_report_files(readme: str, run: Path) -> list[str]:
    """The figures (PNG) and tables (HTML) the README's output table lists, as files of ``run``: its backticked
    names with brace groups expanded and globs matched; a bare file name is looked up under ``results/``."""
    table = readme.split("| output | what |", 1)[1].split("\n\n", 1)[0]
    found = []
    for token in re.findall(r"`([^`]+)`", table):
        for name in expand_braces(token):
            if not name.endswith((".png", ".html")):
                continue
            pattern = name if "/" in name else f"results/**/{name}"
            matches = sorted(str(path.relative_to(run)) for path in run.glob(pattern))
            assert matches, f"README lists {name}, which the demo run did not make"
            found += matches
    return sorted(set(found))


def test_readme_report_files_expand_the_output_table(tmp_path):
    for name in ("results/tables/table1.html", "results/tables/table2.html", "results/figures/fig7_attention.png",
                 "results/figures/fig10_fov.png", "results/tables/table1.parquet"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    readme = ("intro `results/x.html`\n\n| output | what |\n| --- | --- |\n"
              "| `results/tables/table{1,2}.{parquet,html}`, `results/figures/fig{7,8}_*.png` | tables |\n"
              "| `results/{qset}.parquet`, `fig10_fov.png` | more |\n\nafter `results/y.png`\n")
    with pytest.raises(AssertionError, match="fig8_"):  # a listed file the run did not make
        readme_report_files(readme, tmp_path)
    (tmp_path / "results/figures/fig8_attention.png").write_text("x")
    assert readme_report_files(readme, tmp_path) == [
        "results/figures/fig10_fov.png", "results/figures/fig7_attention.png", "results/figures/fig8_attention.png",
        "results/tables/table1.html", "results/tables/table2.html"]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).is_file():
        if os.environ.get("VERBMIRAGE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install -y chromium, or set VERBMIRAGE_CHROMIUM)")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium; CI sets VERBMIRAGE_REQUIRE_BROWSER=1)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def result_lists(page):
    """Each list of results in the report (a category's, or each of its subcategories'), shown in turn from the
    category menu: yields (category, subcategory, the list's rows); back to the menu after each category."""
    for category in page.evaluate("Object.keys(categories)"):
        page.get_by_role("link", name=category, exact=True).click()
        subcategories = page.evaluate("c => Object.keys(categories[c])", category)
        for subcategory in subcategories:
            if len(subcategories) > 1:
                page.get_by_role("link", name=subcategory, exact=True).click()
            yield category, subcategory, page.locator("#app table:not(.vm-headline) tbody tr")  # not the landing's
            if len(subcategories) > 1:
                page.locator("nav ol li a").nth(1).click()  # back to the category
        page.locator("nav ol li a").first.click()  # the breadcrumbs' home: back to the category menu


def _open_result(page, row) -> str:
    """Click a result's view button (the eye) in the report's list; the path the report then shows."""
    row.locator("a[iconname=eye]").click()
    return page.evaluate("app.state.resultPath")


def _figure_top(page) -> tuple[float, float]:
    """The shown figure's top and the top of the box the report shows it in (pixels from the window's top),
    the box scrolled to its start: a figure cut off at the top has its top above the box's."""
    return tuple(page.locator("#app img").last.evaluate(
        "i => { const box = i.closest('.h-screen'); box.scrollTop = 0;"
        " return [i.getBoundingClientRect().top, box.getBoundingClientRect().top]; }"))


def _rendered_size(page, path: str) -> tuple[float, float]:
    """Width and height of the shown result: the decoded image, or the table inside the HTML's frame (0, 0
    where the image does not decode or the frame holds no table)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        if path.endswith(".png"):
            image = page.locator("#app img").last
            image.wait_for(timeout=10_000)
            # decode() rejects for an image that cannot be decoded; its natural size is then 0
            natural = image.evaluate("i => i.decode().then(() => [i.naturalWidth, i.naturalHeight], () => [0, 0])")
            box = image.bounding_box() if min(natural) > 0 else None
        else:
            page.locator("#app iframe").wait_for(timeout=10_000)
            table = page.frame_locator("#app iframe").locator("table").first
            table.wait_for(timeout=10_000)
            box = table.bounding_box()
    except PlaywrightTimeout:
        box = None
    return (box["width"], box["height"]) if box else (0.0, 0.0)


def test_report_renders_in_a_browser(demo_run, demo_report, browser):
    """The report a researcher opens: it loads without console errors, and every figure and table the README's
    output table lists is one of its results and shows with a non-zero size when opened from its category."""
    report, _ = demo_report
    expected = readme_report_files((REPO / "README.md").read_text(), demo_run)
    assert len(expected) >= 20, expected
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    problems = []
    page.on("console", lambda message: problems.append(f"console {message.type}: {message.text}")
            if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url[:100]}"))
    page.goto(report.as_uri())
    categories = page.evaluate("Object.keys(categories)")
    menu = page.get_by_role("link", name="Paper figures", exact=True)
    menu.wait_for()
    artifacts = ARTIFACTS / "report"
    artifacts.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=artifacts / "landing.png")
    # the landing page shows its first line and the headline table (Table 1, ours and the paper's) on the
    # first screen, nothing cut off above it
    for locator in (page.get_by_text("Verb Mirage: verb hallucination of multimodal LLMs."),
                    page.locator("table.vm-headline")):
        box = locator.bounding_box()
        assert box and box["y"] >= 0 and box["y"] + box["height"] <= 800, box
    headline = [row.split("\t") for row in page.locator("table.vm-headline tbody tr").all_inner_texts()]
    assert {"ours", "paper"} <= {cells[0] for cells in headline} and len(headline) >= 12
    assert sorted(categories) == ["Analyses", "Paper figures", "Paper tables", "Run facts"]
    listed = page.evaluate("Object.keys(results)")
    assert not [path for path in expected if path not in listed], "README files not in the report"

    shown: dict[str, tuple[float, float]] = {}
    tops: dict[str, tuple[float, float]] = {}
    for category, subcategory, rows in result_lists(page):
        assert rows.count() == len(page.evaluate("([c, s]) => categories[c][s]", [category, subcategory]))
        if category == "Paper figures":  # listed in the paper's order, parts after their figure's number
            numbers = [re.search(r"^(\d+)([a-z]?)\tFig\. (\d+)", text).groups() for text in rows.all_inner_texts()]
            assert numbers == sorted(numbers) and [int(n) for n, _, _ in numbers] == [int(f) for _, _, f in numbers]
            assert [f"{n}{part}" for n, part, _ in numbers][1:3] == ["03a", "03b"] and len(numbers) >= 18, numbers
        for index in range(rows.count()):
            path = _open_result(page, rows.nth(index))
            shown[path] = _rendered_size(page, path)
            if path.endswith(".png"):
                tops[path] = _figure_top(page)
            if path == "results/figures/fig1_object_vs_verb.png":
                page.locator("#app img").last.screenshot(path=artifacts / "figure.png")
            elif path == "results/figures/fig6b_ambiguity.png":
                page.screenshot(path=artifacts / "tall_figure.png")
            elif path == "results/tables/table1.html":
                page.screenshot(path=artifacts / "table1.png")
    print(f"report screenshots in {artifacts}")
    captions = page.evaluate("Object.fromEntries(Object.entries(results).map(([path, r]) => [path, r.caption]))")
    figures = [path for path in captions if re.search(r"/fig\d+\w*_\w+\.png$", path)]
    assert len(figures) >= 14 and all(captions[path].startswith("<p><strong>The paper found:</strong>")
                                      for path in figures), figures
    assert "results/report/run_facts.html" in shown and "results/benchmark/hico/counts.html" in shown
    missing = [path for path in expected if path not in shown]
    assert not missing, f"not reachable from the report's categories: {missing}"
    empty = {path: size for path, size in shown.items() if not (size[0] > 0 and size[1] > 0)}
    assert not empty, f"shown with no size: {empty}"
    # every figure opens with its top in view: none taller than the box cut off above it (Snakemake centres a
    # result in a box of the screen's height; report/report.css starts it at the top)
    assert len(tops) >= 19 and all(800 > top >= box for top, box in tops.values()), tops
    assert (artifacts / "figure.png").is_file() and (artifacts / "table1.png").is_file()
    assert not problems, problems


# ---- the end of a run ----------------------------------------------------------------------------------------
def test_snakefile_hooks_print_the_end_of_run_summary(demo_run, tmp_path):
    """onsuccess prints where the results are, Table 1's headline and the report command; onerror names the
    failed job, its log and the error in it. Run on a copy of the demo's tables (only rule ``tables`` reruns)."""
    import shutil

    import pandas as pd

    shutil.copy(demo_run / "config.yaml", tmp_path / "config.yaml")
    (tmp_path / "resources").symlink_to(demo_run / "resources")
    for folder in ("results/metrics", "results/tables"):
        shutil.copytree(demo_run / folder, tmp_path / folder)
    command = [sys.executable, "-m", "snakemake", "results/tables/table1.md", "--force", "--snakefile",
               str(REPO / "Snakefile"), "--directory", str(tmp_path), "--configfile", str(tmp_path / "config.yaml"),
               "--cores", "1", "--config", "job_server=False", "--allowed-rules", "tables"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stderr[result.stderr.index("Verb Mirage: the run finished."):]
    table1 = pd.read_parquet(tmp_path / "results/tables/table1.parquet").set_index(["source", "model", "variant"])
    llava = table1.loc[("measured", "tiny_llava", "beam5")]  # its run in the paper's decoding, beam search
    headline = (f"yn_obj {llava.yn_obj_acc:.2f} [{llava.yn_obj_acc_ci_low:.2f}, {llava.yn_obj_acc_ci_high:.2f}]  "
                f"yn_verb {llava.yn_verb_acc:.2f}")
    assert re.search(rf"\n    tiny_llava \(beam5\) +{re.escape(headline)}", text), text
    assert "tables   results/tables/ (" in text and "figures  results/figures/ (0 of " in text  # not copied
    assert f"report --configfile config.yaml` writes {tmp_path / 'report.html'}, then open it in a browser" in text

    (tmp_path / "results/metrics/metrics.parquet").write_bytes(b"not a parquet file")
    failed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    text = failed.stderr[failed.stderr.index("Verb Mirage: the run stopped; 1 job failed:"):]
    assert "\n  tables\n    log logs/tables.log: verbmirage.core.io.DamagedTableError: results/metrics/metrics.parquet" \
        in text, text
    assert "Snakemake's log of this run: .snakemake/log/" in text


# ---- names from a config are text in the report, never script ----------------------------------------------
#: HTML in the config's free strings and in the name of its data folder
PROBES = {"paper_name": "<script>alert(1)</script>", "variant": "<script>alert(2)</script>",
          "stand_in": "<i onmouseover=alert(5)>coin</i>", "folder": "<svg onload=alert(4)>"}


@pytest.fixture(scope="module")
def html_names_report(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A small config (HICO only, the prior and random baselines) whose strings hold HTML (:data:`PROBES`), run
    and reported by ``verbmirage report --configfile``, which writes the config's own report (a minute)."""
    workdir = tmp_path_factory.mktemp("html_names")
    folder = PROBES["folder"]
    write_demo_hico(workdir / folder / "hico", workdir / folder / "hico_det", DemoSizes(train=150, test=60))
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["datasets"] = {"hico": {"root": f"{folder}/hico", "det_root": f"{folder}/hico_det"}}
    config["questions"]["sets"] = ["yn_obj", "yn_verb", "mc_obj", "mc_verb", "obj_exist"]
    config["conditions"] = {"clean": {"type": "clean"}}
    config["models"] = {"prior": {"backend": "prior", "paper_name": PROBES["paper_name"]},
                        "random": {"backend": "random", "seed": 0, "stand_in": PROBES["stand_in"]}}
    config["variants"] = {"default": {"paper_name": PROBES["variant"]}}
    config.update(ensembles={}, analysis={})
    config["metrics"].update(bootstrap_resamples=20, error_consistency=[])
    (workdir / "names.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run([str(Path(sys.executable).parent / "verbmirage"), "report", "--configfile", "names.yaml"],
                            cwd=workdir, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, result


def test_another_configs_report_goes_beside_its_results(html_names_report):
    workdir, result = html_names_report
    report = workdir / "results" / "names" / "report.html"
    assert not (workdir / "report.html").exists()  # the demo's report is not this config's
    # the run's summary comes last, once the report is written, and names this config's report
    assert result.stderr.rstrip().splitlines()[-1] == (
        f"  report   {report} (open it in a browser; `{REPO}/.venv/bin/verbmirage report --configfile names.yaml` "
        "rewrites it)")
    assert [path.name for path in report.parent.glob(".*.html")] == []  # no draft left


def test_names_from_a_config_show_as_text_and_never_run(html_names_report, browser):
    """The probes of :data:`PROBES` raise no dialog and no page error, on the landing or in any result."""
    workdir, _ = html_names_report
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    dialogs, problems = [], []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.goto((workdir / "results" / "names" / "report.html").as_uri())
    page.get_by_role("link", name="Paper tables", exact=True).wait_for()
    page.wait_for_timeout(500)
    assert not dialogs and not problems, (dialogs, problems)  # Snakemake's own report: 30-40 dialogs here
    assert f"hico from {PROBES['folder']}/hico" in page.locator(".vm-landing p").first.inner_text()  # as text
    opened = []
    for _, _, rows in result_lists(page):
        for index in range(rows.count()):
            opened.append(_open_result(page, rows.nth(index)))
            page.wait_for_timeout(100)
    assert {"results/names/tables/table1.html", "results/names/report/run_facts.html",
            "results/names/figures/fig1_object_vs_verb.png"} <= set(opened)
    page.wait_for_timeout(500)
    assert not dialogs and not problems, (dialogs, problems)
