"""Measure lecture decks as an audience sees them: every slide, in headless chromium, offline.

    python tools/measure_slides.py notebooks/06_linear_attention.ipynb   build that deck, then measure it
    python tools/measure_slides.py                                       every lesson, one deck at a time
    python tools/measure_slides.py slides/06_linear_attention.slides.html     a deck already built
    python tools/measure_slides.py NB.ipynb --slides          one line per slide as well
    python tools/measure_slides.py NB.ipynb --strict          exit status 1 when a deck breaks a limit

For each deck it prints: slides, the median and the largest count of visible words per slide, how
many slides show a figure, how many carry more than ``MAX_WORDS`` words and how many are nearly
empty; then each slide that breaks a limit (and, with ``--strict``, the deck-level problems).

A slide is measured as shown at 1280 x 720 with every fragment visible, after the deck's fitting
script has run (so a continuation slide "… (cont.)" counts as a slide of its own):

- **visible words**: the slide's rendered text (``innerText``), split at white space, counting the
  pieces that hold a letter or a digit (so "—" or "|" are not words, ``np.cumsum(x)`` is one).
  The speaker notes, figures (their axis labels and legends) and MathJax's hidden copy of each
  formula for screen readers are left out; each typeset formula, inline or displayed, counts as
  one word (it is read as one term; a slide that is one display equation is not a wall of text).
- **content height**: from the slide's top to the bottom of its lowest cell, in slide pixels.
- **figure**: a plotly figure or an image on the slide; **display equation**: a displayed formula.
- **nearly empty**: content below ``MIN_FILL`` of the frame's height (144 px) with neither a
  figure nor a display equation (one printed line or one sentence on a blank page).

The limits of a re-marked deck (``tests/test_slides.py`` enforces them for the decks it does not
list as pending): no slide over ``MAX_WORDS`` words, no nearly empty slide, a median of at most
``MAX_MEDIAN`` words, the lesson's question on the first slide (a cell tagged ``deck-question``)
and its answer on the last one alone (cells tagged ``deck-answer``).  See slides/README.md.
"""

import argparse
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # run as a script, from anywhere
from tests.browser import CHROMIUM, LAUNCH_ARGS, PageLog  # noqa: E402
from tools import build_slides  # noqa: E402

MAX_WORDS = 90  # visible words on one slide; more is a paragraph read off the screen
MAX_MEDIAN = 45  # a deck's median words per slide (the seed research talk: 45)
MIN_FILL = 0.2  # a slide with no figure or display equation fills at least this share of the height
READY_MS = 90_000

# Everything the measures need from one slide, in slide pixels (the frame is scaled to the window).
MEASURE = """slide => {
    const scale = Reveal.getScale();
    const top = slide.getBoundingClientRect().top;
    const own = selector => [...slide.querySelectorAll(selector)].filter(el => !el.closest("aside.notes"));
    // Text that is no reading matter: figures, MathJax's screen-reader copy, the cell anchors.
    const hidden = own(".MJX_Assistive_MathML, .course-plotly, .js-plotly-plot, img, a.anchor-link");
    const saved = hidden.map(el => [el.style.getPropertyValue("display"), el.style.getPropertyPriority("display")]);
    // (important: MathJax's own style shows its copy with "display: block !important")
    hidden.forEach(el => el.style.setProperty("display", "none", "important"));
    let text;
    try { text = slide.innerText; } finally { hidden.forEach((el, i) => el.style.setProperty("display", ...saved[i])); }
    const tokens = text.split(/\\s+/).filter(token => /[\\p{L}\\p{N}]/u.test(token)).length;
    const formulas = own(".MathJax_SVG").length;
    let bottom = top;
    for (const el of slide.children) {
        if (el.matches("aside.notes, script")) continue;
        const box = el.getBoundingClientRect();
        if (box.height > 0) bottom = Math.max(bottom, box.bottom);
    }
    const figures = own("div.course-plotly, img");
    // The title: the first heading, each formula in it as its TeX source; else the first line.
    const heading = slide.querySelector("h1, h2, h3, .course-cont-title");
    let title = text.trim().split("\\n")[0] || "";
    if (heading) {
        const copy = heading.cloneNode(true);
        copy.querySelectorAll(".MathJax_SVG").forEach(math => {
            const source = document.getElementById(math.id.replace(/-Frame$/, ""));
            math.replaceWith(source ? `$${source.textContent.trim()}$` : "");
        });
        copy.querySelectorAll("script, .MathJax_Preview, a.anchor-link").forEach(el => el.remove());
        title = copy.textContent;
    }
    return {
        words: tokens + formulas,
        height: Math.round((bottom - top) / scale),
        figures: figures.length,
        figure_height: Math.round(Math.max(0, ...figures.map(f => f.getBoundingClientRect().height)) / scale),
        equations: own(".MathJax_SVG_Display").length,
        question: own(".celltag_deck-question").length > 0,
        answer: own(".celltag_deck-answer").length > 0,
        title: title.replace(/\\u00b6/g, "").trim().slice(0, 70),
    };
}"""


def open_deck(browser, deck):
    """Open ``deck`` offline at 1280 x 720; return the page and its log once reveal and MathJax are done."""
    page = browser.new_page(viewport={"width": build_slides.WIDTH, "height": build_slides.HEIGHT})
    log = PageLog(page)
    page.goto(pathlib.Path(deck).resolve().as_uri())
    page.wait_for_selector("body[data-deck-ready=true]", state="attached", timeout=READY_MS)
    page.wait_for_function("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))", timeout=READY_MS)
    return page, log


def leaf_slides(page):
    """reveal's indices of every slide that is shown (each vertical subslide on its own), in order."""
    return page.evaluate("""() => [...document.querySelectorAll(".reveal .slides section")]
        .filter(s => !s.querySelector("section")).map(s => Reveal.getIndices(s))""")


def show_slide(page, at):
    """Go to slide ``at`` with every fragment shown; wait until its figures and its math are drawn."""
    page.evaluate("""at => {
        Reveal.slide(at.h, at.v || 0);
        const fragments = Reveal.getCurrentSlide().querySelectorAll(".fragment").length;
        if (fragments) Reveal.slide(at.h, at.v || 0, fragments - 1);
    }""", at)
    page.wait_for_function("""() => [...Reveal.getCurrentSlide().querySelectorAll("div.course-plotly")]
                                  .every(div => div.querySelector("svg.main-svg"))""", timeout=READY_MS)
    page.evaluate("() => new Promise(done => MathJax.Hub.Queue(() => done(true)))")


def slide_number(index, at):
    """``7 (4.2)``: the number the deck shows (its count from 1), then reveal's horizontal.vertical."""
    return f"{index + 1} ({at['h'] + 1}" + (f".{at['v'] + 1})" if at.get("v") else ")")


def measure_current(page):
    """The measures of the slide now shown (see the module's docstring)."""
    return page.evaluate(f"({MEASURE})(Reveal.getCurrentSlide())")


def measure_deck(page, each=None):
    """Visit every slide of the open deck; return one dict of measures per slide, in order.

    ``each(page, at)``, when given, runs on every slide while it is shown, and what it returns is
    stored under ``"extra"`` (the fit test measures overflow in the same visit).
    """
    slides = []
    for index, at in enumerate(leaf_slides(page)):
        show_slide(page, at)
        slide = {"index": index, "at": at, "number": slide_number(index, at), **measure_current(page)}
        if each is not None:
            slide["extra"] = each(page, at)
        slides.append(slide)
    return slides


def nearly_empty(slide):
    return slide["height"] < MIN_FILL * build_slides.HEIGHT and not slide["figures"] and not slide["equations"]


def summary(slides):
    """The per-deck figures the course holds every deck to: slides, median and largest words, figure slides, and
    the counts of slides over ``MAX_WORDS`` and of nearly empty ones."""
    words = [s["words"] for s in slides]
    largest = max(slides, key=lambda s: s["words"])
    return {
        "slides": len(slides),
        "median_words": statistics.median(words),
        "max_words": largest["words"],
        "max_slide": largest["number"],
        "figure_slides": sum(1 for s in slides if s["figures"]),
        "over_words": sum(1 for s in slides if s["words"] > MAX_WORDS),
        "nearly_empty": sum(1 for s in slides if nearly_empty(s)),
    }


def slide_problems(slides):
    """Each slide that breaks a per-slide limit, as a line that names it."""
    lines = []
    for s in slides:
        if s["words"] > MAX_WORDS:
            lines.append(f"slide {s['number']} \"{s['title']}\": {s['words']} words (limit {MAX_WORDS})")
        if nearly_empty(s):
            lines.append(f"slide {s['number']} \"{s['title']}\": nearly empty, content {s['height']} px high "
                         f"(under {MIN_FILL:.0%} of {build_slides.HEIGHT} px) with no figure or display equation")
    return lines


def deck_problems(slides):
    """What keeps the deck as a whole from the convention: its median, its opening question, its answer."""
    lines = []
    median = statistics.median(s["words"] for s in slides)
    if median > MAX_MEDIAN:
        lines.append(f"median {median:g} words per slide (limit {MAX_MEDIAN})")
    if not slides[0]["question"]:
        lines.append("the first slide does not show the lesson's question (a markdown cell tagged deck-question)")
    answers = [s["number"] for s in slides if s["answer"]]
    if answers != [slides[-1]["number"]]:
        lines.append(f"the answer (cells tagged deck-answer) must be the last slide, alone; found on slides {answers}")
    return lines


def problems(slides):
    """Every breach of the limits of a re-marked deck; empty when the deck keeps them all."""
    return slide_problems(slides) + deck_problems(slides)


def screenshot_slides(slides):
    """Three slides worth looking at: the opening one, the first with a figure (else the wordiest), the last."""
    figure = next((s for s in slides if s["figures"]), None) or max(slides, key=lambda s: s["words"])
    chosen = [slides[0], figure, slides[-1]]
    return [s for i, s in enumerate(chosen) if s["index"] not in {c["index"] for c in chosen[:i]}]


HEADER = f"{'deck':<28} {'slides':>6} {'median':>6} {'max (slide)':>13} {'figures':>7} " \
         f"{f'>{MAX_WORDS}':>5} {'empty':>5}"


def table_row(name, stats):
    largest = f"{stats['max_words']} ({stats['max_slide'].split(' ')[0]})"
    return (f"{name:<28} {stats['slides']:>6} {stats['median_words']:>6g} {largest:>13} {stats['figure_slides']:>7} "
            f"{stats['over_words']:>5} {stats['nearly_empty']:>5}")


def slide_row(s):
    kind = "".join(k for k, on in (("F", s["figures"]), ("E", s["equations"]), ("Q", s["question"]),
                                   ("A", s["answer"])) if on) or "-"
    return f"  {s['number']:>10} {s['words']:>4} words {s['height']:>4} px {kind:<3} {s['title']}"


def decks_to_measure(paths, out):
    """Yield (name, deck html) for each path: a notebook is built into ``out`` first, one at a time."""
    for path in paths:
        path = pathlib.Path(path)
        if path.suffix == ".ipynb":
            (deck,) = build_slides.build([path], out)
        else:
            deck = path
        yield path.name.removesuffix(".slides.html").removesuffix(".ipynb"), deck


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=pathlib.Path,
                        help="notebooks (built first) or built decks (default: every notebooks/NN_*.ipynb)")
    parser.add_argument("--slides", action="store_true", help="print one line per slide")
    parser.add_argument("--strict", action="store_true",
                        help="also check the deck-level rules; exit status 1 when any deck breaks a limit")
    parser.add_argument("--screenshots", type=pathlib.Path, help="save three slides per deck to this folder")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    paths = args.paths or build_slides.lessons()
    failed = False
    rows, every = [], []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, timeout=60_000)
        print(HEADER, flush=True)
        for name, deck in decks_to_measure(paths, pathlib.Path(tmp)):
            page, log = open_deck(browser, deck)
            slides = measure_deck(page)
            every += slides
            rows.append(table_row(name, summary(slides)))
            print(rows[-1], flush=True)
            if args.slides:
                print("\n".join(slide_row(s) for s in slides))
            found = problems(slides) if args.strict else slide_problems(slides)
            for line in found:
                print(f"  {line}")
            failed |= bool(found)
            for line in log.errors + [f"blocked: {url}" for url in log.blocked]:
                print(f"  browser: {line}")
            if args.screenshots:
                args.screenshots.mkdir(parents=True, exist_ok=True)
                for s in screenshot_slides(slides):
                    show_slide(page, s["at"])
                    page.screenshot(path=str(args.screenshots / f"slides-{name}-{s['index'] + 1:02d}.png"))
            page.close()
        browser.close()
    if len(rows) > 1:
        total = summary(every)
        total["max_slide"] = "-"
        print("\n" + HEADER + "\n" + "\n".join(rows) + "\n" + table_row(f"all {len(rows)} decks", total))
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
