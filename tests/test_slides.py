"""The lecture decks: built by ``tools/build_slides.py`` and opened offline in a real browser.

Every lesson deck, plus a small synthetic notebook that exercises each feature (math, a plotly
figure, a widget snapshot, a web link, skipped and notes cells), is built into a temporary
folder and opened in headless chromium with every network request aborted.  A deck passes
when reveal counts its slides, MathJax typesets its math without errors, each figure is drawn
as an SVG, and the console stays free of errors.
"""

import json
import pathlib
import re
import shutil

import nbformat
import plotly.graph_objects as go
import pytest

from tests.browser import PageLog, in_ci, launched, screenshot
from tools import build_slides

LESSONS = build_slides.lessons()
# What every lesson deck must show; a lesson listed here differs from the default.
DEFAULT = {"min_slides": 6, "math": True, "figure": True}
EXPECTED = {"00_welcome": {"min_slides": 4, "math": False, "figure": False}}
READY_MS = 90_000


def expected(stem):
    return {**DEFAULT, **EXPECTED.get(stem, {})}


def _cell(cell, slide_type, **metadata):
    cell.metadata.update(slideshow={"slide_type": slide_type}, **metadata)
    return cell


def synthetic_notebook():
    """Four slides: math, a figure, a widget snapshot with its slider value, references."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    figure = json.loads(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 4, 9], name="n squared")).to_json())
    plot = nbformat.v4.new_output("display_data", data={build_slides.PLOTLY_MIME: figure})
    view = nbformat.v4.new_output("display_data", data={
        build_slides.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
        "text/plain": "interactive(...)"})
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_out"]}},
        "slider": {"model_name": "IntSliderModel", "state": {"description": "n", "value": 8}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [plot]}},
    }
    nb = nbformat.v4.new_notebook(cells=[
        _cell(md("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://x.test)"),
              "skip"),
        _cell(md("# Synthetic deck\n\n$$P = \\operatorname{softmax}(QK^\\top / \\sqrt{d}) \\tag{1.1}$$"), "slide"),
        _cell(code("figure", outputs=[plot]), "slide"),
        _cell(md("The speaker says: mind the $n^2$."), "notes"),
        _cell(code("panel(draw, n=slider)", outputs=[view]), "slide"),
        _cell(md("## References\n\n- [Linformer](https://arxiv.org/abs/2006.04768)\n- <https://arxiv.org/abs/2009.14794>"),
              "slide"),
    ])
    nb.metadata["widgets"] = {build_slides.WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    """Every lesson deck and the synthetic deck, built into one temporary folder: {stem: path}."""
    if shutil.which("npm") is None and not (build_slides.NODE_MODULES / ".package-lock.json").exists():
        if in_ci():
            pytest.fail("npm not found: CI needs Node.js to build the slides", pytrace=False)
        pytest.skip("npm not found: install Node.js (18 or later) to build the slides")
    source = tmp_path_factory.mktemp("synthetic") / "99_synthetic.ipynb"
    nbformat.write(synthetic_notebook(), source)
    out = tmp_path_factory.mktemp("slides")
    return {deck.name.removesuffix(".slides.html"): deck for deck in build_slides.build([*LESSONS, source], out)}


@pytest.fixture(scope="module")
def browser():
    with launched() as browser:
        yield browser


def test_decks_refer_to_nothing_on_the_network(decks):
    for stem, deck in decks.items():
        html = deck.read_text()
        assert build_slides.network_references(html) == [], stem
        assert re.search(r"https?://", html) is None, f"{stem}: a web address is left in the deck"


def test_synthetic_deck_drops_skipped_cells_and_prints_links(decks):
    html = decks["99_synthetic"].read_text()
    assert "colab-badge" not in html
    assert '<aside class="notes">' in html
    assert 'Linformer <span class="course-address">(arxiv.org/abs/2006.04768)</span>' in html
    assert '<span class="course-address">arxiv.org/abs/2009.14794</span>' in html
    assert "shown here at n = 8" in html
    assert html.count('class="course-plotly"') == 2
    assert html.count("plotly.min.js") == 1


def test_vendor_holds_every_library(decks):
    vendor = next(iter(decks.values())).parent / build_slides.VENDOR
    for rel in ("reveal.js/dist/reveal.js", "reveal.js/dist/theme/course.css", "reveal.js/plugin/notes/notes.js",
                "require.js", "plotly.min.js", f"mathjax/config/{build_slides.MATHJAX_CONFIG}.js",
                "mathjax/jax/output/SVG/jax.js"):
        assert (vendor / rel).is_file(), rel
    assert "source-sans-pro" not in (vendor / "reveal.js/dist/theme/course.css").read_text()


def open_deck(browser, deck):
    """Open ``deck`` offline; return the page and its log once reveal and MathJax are done."""
    page = browser.new_page(viewport={"width": build_slides.WIDTH, "height": build_slides.HEIGHT})
    log = PageLog(page)
    page.goto(pathlib.Path(deck).as_uri())
    page.wait_for_selector("body[data-deck-ready=true]", state="attached", timeout=READY_MS)
    page.wait_for_function("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))", timeout=READY_MS)
    return page, log


def figure_slides(page):
    """reveal's indices of each slide that holds a figure."""
    return page.evaluate("""() => {
        const seen = new Map();
        document.querySelectorAll("div.course-plotly").forEach(div => {
            const at = Reveal.getIndices(div.closest("section"));
            seen.set(`${at.h}/${at.v || 0}`, at);
        });
        return [...seen.values()];
    }""")


def show_figures(page):
    """Visit every slide with a figure; return how many SVG figures were drawn there."""
    drawn = 0
    for at in figure_slides(page):
        page.evaluate("at => Reveal.slide(at.h, at.v || 0)", at)
        page.wait_for_function("""() => [...Reveal.getCurrentSlide().querySelectorAll("div.course-plotly")]
                                      .every(div => div.querySelector("svg.main-svg"))""", timeout=READY_MS)
        drawn += page.evaluate("Reveal.getCurrentSlide().querySelectorAll('.js-plotly-plot').length")
    return drawn


def show_first_figure(page):
    """Go to the first slide with a figure (if any) and scroll the figure into view."""
    page.evaluate("""() => {
        const div = document.querySelector("div.course-plotly");
        if (!div) return Reveal.slide(0, 0);
        const at = Reveal.getIndices(div.closest("section"));
        Reveal.slide(at.h, at.v || 0);
        div.scrollIntoView({block: "end"});
    }""")
    page.wait_for_timeout(500)


def math_report(page):
    return page.evaluate("""() => ({
        typeset: document.querySelectorAll(".MathJax_SVG, .MathJax_SVG_Display").length,
        errors: [...document.querySelectorAll(".noError, .MathJax_SVG merror, [data-mjx-error]")]
                  .map(e => e.textContent.slice(0, 80)),
        untypeset: [...document.querySelectorAll(".jp-MarkdownOutput")]
                  .filter(e => /\\$[^$\\s][^$]*\\$/.test(e.innerText)).length,
    })""")


@pytest.mark.browser
def test_synthetic_deck_in_browser(decks, browser):
    page, log = open_deck(browser, decks["99_synthetic"])
    assert page.evaluate("Reveal.getTotalSlides()") == 4
    math = math_report(page)
    assert math["typeset"] >= 1 and math["errors"] == []
    assert show_figures(page) == 2
    assert log.blocked == [] and log.errors == []
    page.close()


@pytest.mark.browser
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_deck_in_browser(decks, browser, lesson):
    want = expected(lesson.stem)
    page, log = open_deck(browser, decks[lesson.stem])
    slides = page.evaluate("Reveal.getTotalSlides()")
    assert slides >= want["min_slides"], f"{slides} slides: check the cells' slideshow.slide_type"
    math = math_report(page)
    assert math["errors"] == [], "MathJax could not typeset this TeX"
    if want["math"]:
        assert math["typeset"] > 0, "no math typeset"
    assert math["untypeset"] == 0, "some $...$ was left as text"
    figures = show_figures(page)
    if want["figure"]:
        assert figures > 0, "no plotly figure drawn (is the notebook executed?)"
    show_first_figure(page)
    screenshot(page, f"slides-{lesson.stem}")
    assert log.blocked == [], "the deck tried to reach the network"
    assert log.errors == []
    page.close()
