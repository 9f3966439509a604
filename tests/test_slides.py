"""The lecture decks: built by ``tools/build_slides.py`` and opened offline in a real browser.

Every lesson deck, plus a small synthetic notebook that exercises each feature (math, a plotly
figure, widget snapshots, a web link, skipped and notes cells, a slide too tall for the frame),
is built into a temporary folder (each deck when a test first needs it, so ``-k 06_linear`` builds
one) and opened in headless chromium at 1280 x 720 with every network request aborted.  A deck
passes when reveal counts its slides, MathJax typesets its math without errors, each figure is
drawn as an SVG, the console stays free of errors, and every slide (each vertical subslide, with
all its fragments shown) fits inside the frame.

Every slide of every deck is also measured as the audience sees it (``tools/measure_slides.py``:
visible words, content height, figure, display equation) and three slides per deck are saved to
build/screenshots/.  Every lesson deck and the worked example of the slide convention
(tests/fixtures/slides/example_deck.ipynb) must keep the limits: no slide over 90 words, none
nearly empty, a median of at most 45 words, the question first and the answer last.  A synthetic
unmarked deck proves that each limit fails when broken.

The figure rules (no browser): legends stand clear of titles, heatmaps carry axis titles.
"""

import collections.abc
import json
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import numpy as np
import plotly
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from course_lib import viz
from tests.browser import SCREENSHOTS, in_ci, launched, screenshot
from tools import build_slides, measure_slides
from tools.measure_slides import leaf_slides, open_deck, show_slide

ROOT = pathlib.Path(__file__).resolve().parent.parent
LESSONS = build_slides.lessons()
EXAMPLE = ROOT / "tests" / "fixtures" / "slides" / "example_deck.ipynb"  # the convention's worked example
# What every lesson deck must show; a lesson listed here differs from the default.
DEFAULT = {"min_slides": 6, "math": True, "figure": True}
EXPECTED = {"00_welcome": {"min_slides": 4, "math": False, "figure": False}}
READY_MS = measure_slides.READY_MS

# Every lesson deck is held to the limits of a lecture deck (tools/measure_slides.py; slides/README.md),
# a new lesson from its first commit, and so is the convention's worked example.
MEASURED = [p.stem for p in LESSONS] + [EXAMPLE.stem]


def expected(stem):
    return {**DEFAULT, **EXPECTED.get(stem, {})}


def _cell(cell, slide_type, **metadata):
    cell.metadata.update(slideshow={"slide_type": slide_type}, **metadata)
    return cell


TALL_LINES = 40  # paragraphs on the synthetic tall slide: about three frames' worth at 24 px type


def tall_markdown():
    """A slide's worth of text far taller than the frame, with a heading the continuations repeat."""
    return "## A very long slide\n\n" + "\n\n".join(f"Paragraph {i} of the long slide." for i in range(TALL_LINES))


def synthetic_notebook():
    """Six slides before fitting: math, a figure, a widget snapshot with its slider value, the
    sliders of ``course_lib.widgets.panel`` beside their stored figure, a slide too tall for the
    frame, references."""
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    figure = json.loads(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 4, 9], name="n squared")).to_json())
    plot = nbformat.v4.new_output("display_data", data={build_slides.PLOTLY_MIME: figure})
    view = nbformat.v4.new_output("display_data", data={
        build_slides.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
        "text/plain": "interactive(...)"})
    sliders = nbformat.v4.new_output("display_data", data={
        build_slides.WIDGET_VIEW: {"model_id": "sliders", "version_major": 2, "version_minor": 0},
        "text/plain": "Sliders at k = 4 (figure below); run the notebook to move them"})
    state = {
        "box": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_slider", "IPY_MODEL_out"]}},
        "slider": {"model_name": "IntSliderModel", "state": {"description": "n", "value": 8}},
        "out": {"model_name": "OutputModel", "state": {"outputs": [plot]}},
        "sliders": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_k"]}},
        "k": {"model_name": "IntSliderModel", "state": {"description": "k", "value": 4}},
    }
    nb = nbformat.v4.new_notebook(cells=[
        _cell(md("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://x.test)"),
              "skip"),
        _cell(md("# Synthetic deck\n\n$$P = \\operatorname{softmax}(QK^\\top / \\sqrt{d}) \\tag{1.1}$$"), "slide"),
        _cell(code("figure", outputs=[plot]), "slide"),
        _cell(md("The speaker says: mind the $n^2$."), "notes"),
        _cell(code("panel(draw, n=slider)", outputs=[view]), "slide"),
        _cell(code("panel(draw, k=slider)", outputs=[sliders, plot]), "slide"),
        _cell(md(tall_markdown()), "slide"),
        _cell(md("## References\n\n- [Linformer](https://arxiv.org/abs/2006.04768)\n- <https://arxiv.org/abs/2009.14794>"),
              "slide"),
    ])
    nb.metadata["widgets"] = {build_slides.WIDGET_STATE: {"state": state, "version_major": 2, "version_minor": 0}}
    return nb


def words(count, start=0):
    """``count`` distinct words to fill a synthetic slide: w0 w1 w2 ..."""
    return " ".join(f"w{i}" for i in range(start, start + count))


COUNTED = (38, 2)  # the counting slide of the unmarked deck: plain words, inline formulas (+ 2 heading words)


def unmarked_notebook():
    """A small deck that breaks every limit of a lecture deck, each on a known slide.

    Slide 1: 97 words (over 90).  Slide 2: one printed line (nearly empty).  Slide 3: a display
    equation with a three-word heading (short, but not empty).  Slide 4: a figure alone (no words,
    not empty).  Slide 5: ``COUNTED`` words and formulas, with 150 words of notes that must not
    count.  Slides 6-9: 63 words each, which lifts the median to 63 (over 45).  No question, no
    answer.
    """
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    figure = json.loads(go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 4, 9], name="n squared")).to_json())
    plot = nbformat.v4.new_output("display_data", data={build_slides.PLOTLY_MIME: figure})
    printed = nbformat.v4.new_output("stream", name="stdout", text="x = 1\n")
    plain, formulas = COUNTED
    cells = [
        _cell(md(f"# Unmarked deck\n\n{words(95)}"), "slide"),
        _cell(code('print("x = 1")', outputs=[printed]), "subslide"),
        _cell(md("## Mind the formula\n\n$$y = x^2 \\tag{1}$$"), "subslide"),
        _cell(code("figure", outputs=[plot]), "slide"),
        _cell(md(f"## Counted words\n\n{words(plain)} $n^2$ $\\sqrt{{d}}$\n{build_slides.NOTES_MARK}\n"
                 f"{words(150, start=1000)}"), "subslide"),
    ]
    cells += [_cell(md(f"## Filler slide {i}\n\n{words(60)}"), "slide") for i in range(4)]
    return nbformat.v4.new_notebook(cells=cells)


class Decks(collections.abc.Mapping):
    """{stem: deck path}, each deck built into one folder the first time it is asked for."""

    def __init__(self, sources, out):
        self.sources, self.out, self.built = {p.stem: p for p in sources}, out, {}

    def __getitem__(self, stem):
        if stem not in self.built:
            (self.built[stem],) = build_slides.build([self.sources[stem]], self.out)
        return self.built[stem]

    def __iter__(self):
        return iter(self.sources)

    def __len__(self):
        return len(self.sources)


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    """Every lesson deck, the worked example, the synthetic and the unmarked deck: {stem: path}."""
    if shutil.which("npm") is None and not (build_slides.NODE_MODULES / ".package-lock.json").exists():
        if in_ci():
            pytest.fail("npm not found: CI needs Node.js to build the slides", pytrace=False)
        pytest.skip("npm not found: install Node.js (18 or later) to build the slides")
    folder = tmp_path_factory.mktemp("notebooks")
    synthetic, unmarked = folder / "99_synthetic.ipynb", folder / "98_unmarked.ipynb"
    nbformat.write(synthetic_notebook(), synthetic)
    nbformat.write(unmarked_notebook(), unmarked)
    return Decks([*LESSONS, EXAMPLE, synthetic, unmarked], tmp_path_factory.mktemp("slides"))


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
    assert "shown here at k = 4" in html and "Sliders at k = 4" not in html
    assert html.count('<div class="course-plotly') == 3 and html.count('course-plotly course-fill') == 3
    assert html.count("plotly.min.js") == 1


def test_code_that_draws_or_runs_long_goes_to_the_speaker_notes():
    code = nbformat.v4.new_code_cell
    figure = nbformat.v4.new_output("display_data", data={build_slides.PLOTLY_MIME: {"data": [], "layout": {}}})
    short, drawn = code("x = 1\nprint(x)"), code("viz.lines(x, y)", outputs=[figure])
    long = code("\n".join(f"a{i} = {i}" for i in range(build_slides.CODE_LINES + 1)))
    nb = build_slides.prepare(nbformat.v4.new_notebook(cells=[_cell(c, "slide") for c in (short, drawn, long)]))
    kinds = [(c.cell_type, c.metadata.get("slideshow", {}).get("slide_type")) for c in nb.cells]
    assert kinds == [("code", "slide"), ("code", "slide"), ("markdown", "notes"), ("code", "slide"),
                     ("markdown", "notes")]
    assert "transient" not in nb.cells[0].metadata
    assert [c.metadata.get("transient", {}).get("remove_source", False) for c in nb.cells[1::2]] == [True] * 2
    assert "viz.lines(x, y)" in nb.cells[2].source and "a8 = 8" in nb.cells[4].source


def test_consecutive_prints_become_one_block():
    stream = nbformat.v4.new_output
    outputs = [stream("stream", name="stdout", text="n = 1; "), stream("stream", name="stdout", text="n = 2\n"),
               stream("stream", name="stderr", text="warning\n")]
    joined = build_slides.offline_outputs(outputs, {})
    assert [(o.name, o.text) for o in joined] == [("stdout", "n = 1; n = 2\n"), ("stderr", "warning\n")]


# --- The marking convention (no browser) ---

def kinds(nb):
    return [(c.cell_type, build_slides.slide_type(c)) for c in nb.cells]


def test_text_after_the_notes_mark_goes_to_the_speaker_notes():
    md = nbformat.v4.new_markdown_cell
    mark = build_slides.NOTES_MARK
    cells = [_cell(md(f"## Point\n\n- bullet\n{mark}\nThe paragraph."), "slide"),
             _cell(md(f"{mark}\nOnly notes."), "subslide"),
             _cell(md(f"Said, not shown.\n  {mark}  \nMore."), "notes"),
             _cell(md("## No mark\n\n<!-- notes: not the mark -->"), "slide"),
             _cell(md(f"## Shown\n{mark}\n"), "-")]
    nb = build_slides.prepare(nbformat.v4.new_notebook(cells=cells))
    assert kinds(nb) == [("markdown", "slide"), ("markdown", "notes"), ("markdown", "notes"), ("markdown", "notes"),
                         ("markdown", "slide"), ("markdown", "-")]
    assert [c.source for c in nb.cells] == ["## Point\n\n- bullet", "The paragraph.", "Only notes.",
                                            "Said, not shown.\n\nMore.", "## No mark\n\n<!-- notes: not the mark -->",
                                            "## Shown"]


def test_answer_cells_close_the_deck_and_the_question_opens_it():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    printed = nbformat.v4.new_output("stream", name="stdout", text="42\n")
    cells = [_cell(md("# Title"), "slide", tags=["deck-question"]),
             _cell(md("## Answer: 42"), "subslide", tags=["deck-answer"]),
             _cell(code("print(42)", outputs=[printed]), "fragment", tags=["deck-answer"]),
             _cell(code("print(6 * 7)", outputs=[printed]), "subslide", tags=["deck-answer"]),
             _cell(md("## References"), "slide")]
    nb = build_slides.prepare(nbformat.v4.new_notebook(cells=cells))
    assert [c.source.splitlines()[0] for c in nb.cells] == ["# Title", "## References", "## Answer: 42", "print(42)",
                                                           "```python", "print(6 * 7)", "```python"]
    assert [build_slides.slide_type(c) for c in nb.cells] == ["slide", "slide", "slide", "fragment", "notes", "-",
                                                             "notes"]
    assert all(c.metadata["transient"]["remove_source"] for c in nb.cells if c.cell_type == "code")
    late = [_cell(md("# Title"), "slide"), _cell(md("**The question?**"), "subslide", tags=["deck-question"])]
    with pytest.raises(ValueError, match="deck-question is on slide 2"):
        build_slides.prepare(nbformat.v4.new_notebook(cells=late))
    on_first = [_cell(md("# Title"), "slide"), _cell(md("**The question?**"), "-", tags=["deck-question"])]
    build_slides.prepare(nbformat.v4.new_notebook(cells=on_first))


def filled(nb):
    """For each code cell of a prepared notebook: whether its figure fills the slide."""
    return [any("course-fill" in o.get("data", {}).get("text/html", "") for o in c.outputs)
            for c in nb.cells if c.cell_type == "code"]


def test_a_figure_alone_on_its_slide_fills_it():
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    figure = nbformat.v4.new_output("display_data", data={build_slides.PLOTLY_MIME: {"data": [], "layout": {}}})
    printed = nbformat.v4.new_output("stream", name="stdout", text="x = 1\n")
    cells = [_cell(md("# Title"), "slide"),
             _cell(code("fig", outputs=[figure]), "subslide"),  # alone: fills
             _cell(md("Notes about it."), "notes"),
             _cell(md("## A heading that states the point"), "subslide"),
             _cell(code("fig", outputs=[figure]), "-"),  # under a heading alone: fills
             _cell(code("fig", outputs=[figure, printed]), "subslide"),  # and a printed line: keeps its size
             _cell(md("## Two lines\n\nof text"), "subslide"),
             _cell(code("fig", outputs=[figure]), "-"),  # under a paragraph: keeps its size
             _cell(code("fig", outputs=[figure]), "subslide"),
             _cell(code("x = 1", outputs=[printed]), "fragment")]  # with a fragment: keeps its size
    nb = build_slides.prepare(nbformat.v4.new_notebook(cells=cells))
    assert filled(nb) == [True, True, False, False, False, False]


def test_vendor_holds_every_library(decks):
    vendor = next(iter(decks.values())).parent / build_slides.VENDOR
    for rel in ("reveal.js/dist/reveal.js", "reveal.js/dist/theme/course.css", "reveal.js/plugin/notes/notes.js",
                "require.js", "plotly.min.js", f"mathjax/config/{build_slides.MATHJAX_CONFIG}.js",
                "mathjax/jax/output/SVG/jax.js"):
        assert (vendor / rel).is_file(), rel
    assert "source-sans-pro" not in (vendor / "reveal.js/dist/theme/course.css").read_text()


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


# How far (px, in slide coordinates) a slide's content reaches past its bottom and right edges: the
# slide's own scroll size (overflow of the slide) and that of any scrolled box inside it (a wide table
# cut off inside its output area).  Plotly's own clipped layers and MathJax's hidden copy of each
# formula for screen readers are not content that could be read.
SLIDE_EXCESS = """slide => {
    const frame = document.querySelector(".reveal .slides").getBoundingClientRect();
    const scale = Reveal.getScale();
    const box = slide.getBoundingClientRect();
    let bottom = Math.max(slide.scrollHeight - slide.clientHeight, (box.bottom - frame.bottom) / scale);
    let right = Math.max(slide.scrollWidth - slide.clientWidth, (box.right - frame.right) / scale);
    for (const el of slide.querySelectorAll("*")) {
        if (el.closest(".js-plotly-plot, aside.notes, svg, .MJX_Assistive_MathML")) continue;
        const style = getComputedStyle(el);
        if (style.overflowY !== "visible") bottom = Math.max(bottom, el.scrollHeight - el.clientHeight);
        if (style.overflowX !== "visible") right = Math.max(right, el.scrollWidth - el.clientWidth);
    }
    const heading = slide.querySelector("h1, h2, h3, h4");
    const text = (heading || slide).innerText.trim().split("\\n")[0];
    return {bottom: Math.round(bottom), right: Math.round(right), title: text.replace(/¶$/, "").slice(0, 80)};
}"""
OVERFLOW_PX = 2  # sub-pixel rounding of scaled layout; a real overflow is a line of text or more


def slide_excess(page, at):
    """How far the slide now shown (``at``) passes the frame: a dict as ``SLIDE_EXCESS``, with its number."""
    excess = page.evaluate(f"({SLIDE_EXCESS})(Reveal.getCurrentSlide())")
    return {"slide": f"{at['h'] + 1}" + (f".{at['v'] + 1}" if at.get("v") else ""), **excess}


def overflows(excess):
    return max(excess["bottom"], excess["right"]) > OVERFLOW_PX


def overflowing_slides(page):
    """Every slide of the open deck whose content passes its bottom or right edge at 1280 x 720.

    Returns dicts with the slide number as reveal shows it (1-based, ``h`` or ``h.v``), its title
    and the excess in px.
    """
    found = []
    for at in leaf_slides(page):
        show_slide(page, at)
        excess = slide_excess(page, at)
        if overflows(excess):
            found.append(excess)
    return found


def math_report(page):
    return page.evaluate("""() => ({
        typeset: document.querySelectorAll(".MathJax_SVG, .MathJax_SVG_Display").length,
        errors: [...document.querySelectorAll(".noError, .MathJax_SVG merror, [data-mjx-error]")]
                  .map(e => e.textContent.slice(0, 80)),
        untypeset: [...document.querySelectorAll(".jp-MarkdownOutput")]
                  .filter(e => /\\$[^$\\s][^$]*\\$/.test(e.innerText)).length,
    })""")


def overflow_report(stem, found):
    return f"{stem}: {len(found)} slide(s) pass the 1280 x 720 frame:\n" + "\n".join(
        f"  slide {f['slide']} \"{f['title']}\": {f['bottom']} px below, {f['right']} px right" for f in found)


def slide_titles(page):
    return page.evaluate("""() => [...document.querySelectorAll(".reveal .slides section")]
        .filter(s => !s.querySelector("section"))
        .map(s => (s.querySelector("h1, h2, h3") || {textContent: ""}).textContent.replace(/\u00b6/g, "").trim())""")


@pytest.mark.browser
def test_synthetic_deck_in_browser(decks, browser):
    page, log = open_deck(browser, decks["99_synthetic"])
    titles = slide_titles(page)
    continued = [t for t in titles if t == "A very long slide (cont.)"]
    assert len(continued) >= 1, f"the tall slide was not continued: {titles}"
    assert page.evaluate("Reveal.getTotalSlides()") == 6 + len(continued)
    math = math_report(page)
    assert math["typeset"] >= 1 and math["errors"] == []
    assert show_figures(page) == 3
    assert overflowing_slides(page) == [], overflow_report("99_synthetic", overflowing_slides(page))
    text = page.evaluate("document.querySelector('.reveal .slides').textContent")
    assert all(f"Paragraph {i} of" in text for i in range(TALL_LINES)), "the continuation lost a paragraph"
    assert log.blocked == [] and log.errors == []
    page.close()


@pytest.mark.browser
def test_overflow_check_names_each_slide_that_passes_the_frame(decks, browser):
    """The fit check can fail: a block made taller (and one wider) than the frame after fitting is reported."""
    page, _ = open_deck(browser, decks["99_synthetic"])
    page.evaluate("""() => {
        const slides = [...document.querySelectorAll(".reveal .slides section")]
            .filter(s => !s.querySelector("section"));
        const tall = document.createElement("div");
        tall.style.height = "900px";
        slides[1].appendChild(tall);
        const wide = document.createElement("pre");
        wide.style.cssText = "overflow-x: auto; white-space: pre";
        wide.textContent = "x".repeat(400);
        slides[0].appendChild(wide);
    }""")
    found = {f["slide"]: f for f in overflowing_slides(page)}
    assert set(found) == {"1", "2"}, overflow_report("99_synthetic", list(found.values()))
    assert found["2"]["bottom"] > 100 and found["1"]["right"] > 100
    assert found["1"]["title"] == "Synthetic deck"
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
    assert log.blocked == [], "the deck tried to reach the network"
    assert log.errors == []
    page.close()


@pytest.fixture(scope="module")
def walked(decks, browser):
    """walk(stem): every slide of a deck visited once, measured (``measure_slides``, with the overflow
    under ``"extra"``), three of them saved to build/screenshots/; the result is kept for other tests."""
    done = {}

    def walk(stem):
        if stem not in done:
            page, log = open_deck(browser, decks[stem])
            slides = measure_slides.measure_deck(page, each=slide_excess)
            for slide in measure_slides.screenshot_slides(slides):
                show_slide(page, slide["at"])
                screenshot(page, f"slides-{stem}-{slide['index'] + 1:02d}")
            page.close()
            done[stem] = {"slides": slides, "errors": log.errors, "blocked": log.blocked}
        return done[stem]

    return walk


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("stem", MEASURED)
def test_every_slide_fits_the_frame(walked, stem):
    found = [s["extra"] for s in walked(stem)["slides"] if overflows(s["extra"])]
    assert found == [], overflow_report(stem, found)


# --- The limits of a lecture deck: words, fill, the question and the answer (tools/measure_slides.py) ---

def measures_report(stem, slides):
    stats = measure_slides.summary(slides)
    return (f"{stem}: {stats['slides']} slides, median {stats['median_words']:g} words, largest "
            f"{stats['max_words']} (slide {stats['max_slide']}), {stats['figure_slides']} with a figure, "
            f"{stats['over_words']} over {measure_slides.MAX_WORDS} words, {stats['nearly_empty']} nearly empty")


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("stem", MEASURED)
def test_deck_measures(walked, stem):
    """Every deck keeps every limit: a slide over 90 visible words, a slide filled below 20 % with no
    figure or equation, a median over 45 words, a deck without its question first and its answer last fail."""
    walk = walked(stem)
    slides = walk["slides"]
    assert walk["errors"] == [] and walk["blocked"] == []
    found = measure_slides.problems(slides)
    assert found == [], measures_report(stem, slides) + "\n  " + "\n  ".join(found)


# --- Widget cells: a notebook opened without running it shows a figure in their place ---

@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_widget_cells_store_a_figure_for_a_fresh_view(lesson):
    """Every cell with a widget also stores, as an ordinary output, the figure at the sliders'
    defaults (``course_lib.widgets.panel``), and the widget's text form is not ``interactive(...``."""
    nb = nbformat.read(lesson, as_version=4)
    for index, cell in enumerate(nb.cells):
        outputs = [o.get("data", {}) for o in cell.get("outputs", [])]
        views = [data for data in outputs if build_slides.WIDGET_VIEW in data]
        if not views:
            continue
        assert any(build_slides.PLOTLY_MIME in data for data in outputs), \
            f"{lesson.stem}, cell {index}: no stored figure beside the widget (re-execute with widgets.panel)"
        assert not any(data.get("text/plain", "").startswith("interactive(") for data in views), \
            f"{lesson.stem}, cell {index}: the widget's fallback text is interactive(children=..."


# --- Figures: legends never cover titles; heatmaps name their axes (no browser) ---

def busy_figure():
    """The shape of lesson 04's benchmark figure: a title, two subplot titles, eight long legend entries."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward time (s)", "peak memory (MiB)"))
    n = np.array([512, 1024, 2048, 4096])
    for i in range(8):
        for col in (1, 2):
            fig.add_trace(go.Scatter(x=n, y=n * (i + 1.0) ** col, name=f"linformer_reference, k = {64 * (i + 1)}",
                                     legendgroup=str(i), showlegend=col == 1, line=dict(color=viz.COLORS[i])),
                          row=1, col=col)
    viz.style(fig, title="Precomputed: forward time and peak memory versus n", height=440)
    fig.update_xaxes(title="n", type="log")
    return fig


def figures():
    """A few figures built with the course's builders, by name."""
    x = np.arange(1, 9)
    return {
        "lines": viz.lines(x, {"exact": x, "approximate": x + 1.0}, title="Error", x_title="k", y_title="error"),
        "heatmap": viz.heatmap(np.eye(4), title="P"),
        "busy": busy_figure(),
    }


def subplot_titles(fig):
    return [a for a in fig.layout.annotations if a.yref and a.yref.startswith("paper") and (a.y or 0) >= 1]


@pytest.mark.parametrize("name", ["lines", "heatmap", "busy"])
def test_legend_stands_clear_of_the_titles(name):
    """Rules: the legend is right of the plot (x >= 1, anchored left) or below it (y < 0, anchored at its
    top), never above it where the title is; the top margin holds the title (60 px) and, when subplot
    titles sit above the plots too, a second line (90 px)."""
    fig = figures()[name]
    legend, margin = fig.layout.legend, fig.layout.margin
    right = legend.x is not None and legend.x >= 1 and legend.xanchor == "left"
    below = legend.y is not None and legend.y < 0 and legend.yanchor == "top"
    assert right or below, f"{name}: legend at x={legend.x}, y={legend.y}"
    if fig.layout.title.text:
        assert margin.t >= (90 if subplot_titles(fig) else 60), f"{name}: top margin {margin.t} px"


def test_heatmaps_name_their_axes():
    fig = figures()["heatmap"]
    assert fig.layout.xaxis.title.text == "key position j" and fig.layout.yaxis.title.text == "query position i"
    named = viz.heatmap(np.eye(3), x_title="column", y_title="row")
    assert (named.layout.xaxis.title.text, named.layout.yaxis.title.text) == ("column", "row")
    with pytest.raises(ValueError, match="x_title"):
        viz.heatmap(np.eye(3), x_title=None)


def boxes_overlap(a, b):
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] \
        and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


@pytest.mark.browser
@pytest.mark.parametrize("where", ["notebook", "slide"])
def test_busy_figure_legend_covers_no_title_in_browser(browser, tmp_path, where):
    """Draw the busy figure as the notebook and the deck do; no title's box meets the legend's."""
    fig = json.loads(busy_figure().to_json())
    layout = build_slides.projected_layout(fig["layout"]) if where == "slide" else fig["layout"]
    plotly_js = pathlib.Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    page_html = tmp_path / "figure.html"
    page_html.write_text(f'<html><body><div id="f" style="width: 1180px; height: {layout["height"]}px"></div>'
                         f'<script src="{plotly_js.as_uri()}"></script><script>'
                         f'Plotly.newPlot("f", {json.dumps(fig["data"])}, {json.dumps(layout)})'
                         '.then(() => document.body.dataset.drawn = "true");</script></body></html>')
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(page_html.as_uri())
    page.wait_for_selector("body[data-drawn=true]", state="attached", timeout=READY_MS)
    boxes = page.evaluate("""() => {
        const box = el => {
            const r = el.getBoundingClientRect();
            return {x: r.x, y: r.y, width: r.width, height: r.height};
        };
        return {legend: box(document.querySelector("g.legend")),
                titles: [...document.querySelectorAll(".g-gtitle text, .annotation, .g-xtitle, .g-x2title")].map(box)};
    }""")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"figure-busy-{where}.png"))
    page.close()
    assert len(boxes["titles"]) >= 4 and boxes["legend"]["height"] > 0
    hit = [t for t in boxes["titles"] if boxes_overlap(boxes["legend"], t)]
    assert hit == [], f"the legend covers {hit}"


@pytest.mark.browser
@pytest.mark.slow
def test_unmarked_deck_breaks_each_limit_on_its_slide(walked):
    """Each limit fires on the slide that breaks it, and only there: 97 words, one printed line, the
    median, no question, no answer; an equation or a figure keeps a short slide from counting as empty."""
    slides = walked("98_unmarked")["slides"]
    assert len(slides) == 9
    assert [s["words"] for s in slides][0] == 97
    plain, formulas = COUNTED
    assert slides[4]["words"] == 2 + plain + formulas, "the notes (150 words) or the formulas were miscounted"
    assert slides[2]["equations"] == 1 and slides[3]["figures"] == 1 and slides[3]["words"] == 0
    found = measure_slides.problems(slides)
    assert [line.split(" ")[1] for line in found if line.startswith("slide ")] == ["1", "2"], found
    assert "97 words (limit 90)" in found[0] and "nearly empty" in found[1]
    assert found[2:] == [
        "median 63 words per slide (limit 45)",
        "the first slide does not show the lesson's question (a markdown cell tagged deck-question)",
        "the answer (cells tagged deck-answer) must be the last slide, alone; found on slides []",
    ]
    assert measure_slides.summary(slides) == {"slides": 9, "median_words": 63, "max_words": 97, "max_slide": "1 (1)",
                                              "figure_slides": 1, "over_words": 1, "nearly_empty": 1}


@pytest.mark.browser
@pytest.mark.slow
def test_example_deck_shows_the_convention(decks, browser, walked):
    """The worked example: the question opens the deck, the answer (moved past the references) closes
    it, the figure alone on its slide fills most of the frame, a slide-big result is set large and
    its code is in the notes, and the prose after <!-- notes --> is in the notes and not on a slide."""
    slides = walked(EXAMPLE.stem)["slides"]
    assert slides[0]["question"] and slides[-1]["answer"] and "The answer" in slides[-1]["title"]
    assert slides[-2]["title"] == "References"
    figure = next(s for s in slides if s["figures"])
    assert figure["figure_height"] >= 0.8 * build_slides.HEIGHT, figure
    page, _ = open_deck(browser, decks[EXAMPLE.stem])
    big = page.evaluate("""() => {
        const pre = document.querySelector(".celltag_slide-big .jp-OutputArea-output pre");
        const cell = pre.closest(".jp-Cell");
        return {size: parseFloat(getComputedStyle(pre).fontSize), text: pre.textContent,
                code: cell.querySelector(".jp-InputArea") !== null,
                notes: [...cell.closest("section").querySelectorAll("aside.notes")].map(a => a.textContent).join(" ")};
    }""")
    assert big["size"] >= 28 and big["text"].startswith("64 MiB") and not big["code"], big
    assert "print(f" in big["notes"]
    notes = page.evaluate("[...document.querySelectorAll('aside.notes')].map(a => a.textContent).join(' ')")
    assert "its size does not depend on the head dimension" in notes.lower()
    shown = page.evaluate("""() => [...document.querySelectorAll(".reveal .slides section")]
        .map(s => s.innerText).join(" ")""")
    assert "head dimension" not in shown and "<!-- notes -->" not in page.content().split("<body")[1]
    page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_measuring_command(decks, walked):
    """``tools/measure_slides.py`` prints the deck's figures; --strict exits 1 on a deck that breaks a limit."""
    command = [sys.executable, str(ROOT / "tools" / "measure_slides.py"), "--strict"]
    good = subprocess.run([*command, str(decks[EXAMPLE.stem])], capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.splitlines()[1].split()[:2] == [EXAMPLE.stem, str(len(walked(EXAMPLE.stem)["slides"]))]
    bad = subprocess.run([*command, "--slides", str(decks["98_unmarked"])], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.splitlines()[1].split() == ["98_unmarked", "9", "63", "97", "(1)", "1", "1", "1"]
    assert "median 63 words per slide (limit 45)" in bad.stdout and "nearly empty" in bad.stdout

