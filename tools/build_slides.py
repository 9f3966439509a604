"""Build the lecture decks: one reveal.js deck per lesson, openable with no network.

    python tools/build_slides.py                  every notebooks/NN_*.ipynb -> slides/NN_*.slides.html
    python tools/build_slides.py NB.ipynb --out DIR

Each cell's ``metadata.slideshow.slide_type`` places it (``slide``, ``subslide``,
``fragment``, ``-``, ``notes``, ``skip``), and a marking convention makes a lesson a lecture deck
with no prose duplicated (slides/README.md has the rules and an example):

- in a markdown cell, the lines after a line that is exactly ``<!-- notes -->`` go to the speaker
  notes (``NOTES_MARK``; invisible in JupyterLab); the lines above it are the slide;
- a figure that is alone on its slide (a heading above it allowed) fills the slide's height;
- a code cell tagged ``slide-big`` shows its printed result large, its code in the notes;
- cells tagged ``deck-question`` must be on the first slide (the lesson's question, set large);
  cells tagged ``deck-answer`` close the deck as its last slide (moved there, results large).

reveal.js 4, MathJax 2 and require.js come from
npm (``tools/slides/package-lock.json``, installed with ``npm ci`` when needed) and are
copied with plotly's own ``plotly.min.js`` into ``DIR/vendor/``, which every deck loads
by relative path.  At build time plotly outputs become a div drawn by the deck, widget views
become a snapshot of the figure they showed, code that draws a figure (or is longer than
``CODE_LINES``) moves to the speaker notes, and web links become printed addresses; a deck
that still refers to anything on the network is an error.

Every slide fits the 1280 x 720 frame: when the deck opens, the template's fitting script
(``course.html.j2``) shrinks figures towards ``MIN_FIGURE_HEIGHT``, then sets the slide's
text and code smaller, then moves the cells that still do not fit to continuation slides
titled "… (cont.)", and scales a single cell that is taller or wider than a slide on its own.
"""

import argparse
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys

import nbformat
import plotly
from nbconvert import SlidesExporter

ROOT = pathlib.Path(__file__).resolve().parent.parent
SLIDES_DIR = ROOT / "tools" / "slides"
NODE_MODULES = SLIDES_DIR / "node_modules"
VENDOR = "vendor"
WIDTH, HEIGHT = 1280, 720
MATHJAX_CONFIG = "TeX-AMS_SVG-full"  # SVG output: glyphs are paths, no math fonts to load
FIGURE_FONT_SIZE, TITLE_ROOM = 16, 30  # px; plotly's default 12 px type is too small on a projector
MIN_FIGURE_HEIGHT = 320  # px; below this a two-panel figure's axes and legend no longer read from the back row
CODE_LINES = 8  # longer code is read in the notebook, not from a projector: it goes to the speaker notes

# The marking convention (see slides/README.md).
NOTES_MARK = "<!-- notes -->"  # a line of its own in a markdown cell: what follows is speaker notes
BIG = "slide-big"  # cell tag: the printed result is shown large, the code goes to the notes
QUESTION = "deck-question"  # cell tag: the lesson's question, on the deck's first slide
ANSWER = "deck-answer"  # cell tag: the lesson's answer, moved to the deck's last slide
STARTS = ("slide", "subslide")  # slide types that start a slide (each subslide is a slide on screen)

PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# What a browser would fetch: src/href/srcset/poster attributes, CSS url() and @import, JS import.
NETWORK_REFERENCE = re.compile(
    r"""(?:\b(?:src|href|srcset|poster|data-src|action)\s*=\s*["']?\s*"""
    r"""|\burl\(\s*["']?\s*|@import\s+["']\s*|\bimport\b[^;'"]*\bfrom\s*["']\s*)(?:https?:)?//""",
    re.IGNORECASE,
)
LINK = re.compile(r"""<a\s[^>]*?href\s*=\s*["'](https?://[^"']+)["'][^>]*>(.*?)</a>""", re.IGNORECASE | re.DOTALL)
STYLE = re.compile(r"(<style[^>]*>)(.*?)(</style>)", re.IGNORECASE | re.DOTALL)
CSS_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)

# MathJax 2 is 70 MB; a deck needs the TeX input, the SVG output and their extensions.
MATHJAX_SKIP = ("fonts", "unpacked", "test", "docs", "jax/output/HTML-CSS", "jax/output/CommonHTML",
                "jax/output/NativeMML", "jax/output/PlainSource", "extensions/HTML-CSS")


def network_references(text):
    """Every place in ``text`` (HTML, CSS or JS) that would make a browser fetch from the network."""
    return [text[max(m.start() - 40, 0): m.end() + 40] for m in NETWORK_REFERENCE.finditer(text)]


def ensure_node_modules():
    """Run ``npm ci`` in tools/slides/ unless node_modules already matches package-lock.json."""
    installed = NODE_MODULES / ".package-lock.json"
    lock = SLIDES_DIR / "package-lock.json"
    if installed.exists() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("npm not found: install Node.js (18 or later) to build the slides")
    subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=SLIDES_DIR, check=True)


def _mathjax_ignore(directory, names):
    rel = pathlib.Path(directory).relative_to(NODE_MODULES / "mathjax").as_posix()
    skip = [n for n in names if (n if rel == "." else f"{rel}/{n}") in MATHJAX_SKIP]
    if rel == "config":  # the one combined configuration the decks name
        skip += [n for n in names if n != f"{MATHJAX_CONFIG}.js"]
    if rel == "localization":  # menus in English only
        skip += [n for n in names if n != "en"]
    return skip


def _theme_css():
    """reveal's white theme without its web-font import, then the course's own rules."""
    white = (NODE_MODULES / "reveal.js" / "dist" / "theme" / "white.css").read_text()
    white = re.sub(r"@import url\([^)]*\);\n?", "", white)
    return white + "\n" + (SLIDES_DIR / "course.css").read_text()


def copy_vendor(out):
    """Copy the libraries the decks load into ``out/vendor`` (skipped when already current)."""
    vendor = out / VENDOR
    plotly_js = pathlib.Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    sources = [SLIDES_DIR / "package-lock.json", SLIDES_DIR / "course.css", plotly_js, pathlib.Path(__file__)]
    stamp = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()
    if (vendor / "STAMP").exists() and (vendor / "STAMP").read_text() == stamp:
        return vendor
    shutil.rmtree(vendor, ignore_errors=True)
    reveal = NODE_MODULES / "reveal.js"
    for rel in ("dist/reveal.css", "dist/reveal.js", "plugin/notes/notes.js", "LICENSE"):
        (vendor / "reveal.js" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(reveal / rel, vendor / "reveal.js" / rel)
    (vendor / "reveal.js" / "dist" / "theme" / "course.css").parent.mkdir(parents=True)
    (vendor / "reveal.js" / "dist" / "theme" / "course.css").write_text(_theme_css())
    shutil.copytree(NODE_MODULES / "mathjax", vendor / "mathjax", ignore=_mathjax_ignore)
    shutil.copy2(NODE_MODULES / "requirejs" / "require.js", vendor / "require.js")
    shutil.copy2(plotly_js, vendor / "plotly.min.js")
    for css in (vendor / "reveal.js").rglob("*.css"):
        if network_references(css.read_text()):
            raise RuntimeError(f"{css} refers to the network: {network_references(css.read_text())}")
    (vendor / "STAMP").write_text(stamp)
    return vendor


def projected_layout(layout):
    """A notebook figure's layout for a projected slide: larger type, room for the larger title, and
    its size taken from the slide (the width of the slide, the height the fitting script leaves it)."""
    layout = dict(layout)
    layout["font"] = {"size": FIGURE_FONT_SIZE, **layout.get("font", {})}
    margin = dict(layout.get("margin", {}))
    margin["t"] = margin.get("t", 80) + TITLE_ROOM
    layout["margin"], layout["height"] = margin, (layout.get("height") or 450) + TITLE_ROOM
    layout.pop("width", None)
    layout["autosize"] = True
    return layout


def plotly_html(figure):
    """A plotly figure as a div the deck draws when its slide is shown (see course.html.j2)."""
    layout = projected_layout(figure.get("layout", {}))
    height = layout.pop("height")  # the div's height, which the fitting script may lower
    spec = json.dumps({"data": figure.get("data", []), "layout": layout})
    spec = spec.replace("</", "<\\/")  # the JSON must not close its <script>
    return (f'<div class="course-plotly" data-height="{height}" data-min-height="{min(height, MIN_FIGURE_HEIGHT)}"'
            f' style="height: {height}px"></div>'
            f'<script type="application/json" class="course-plotly-figure">{spec}</script>')


def _widget_parts(state, model_id, controls, outputs):
    """Collect the controls and the captured outputs below the widget ``model_id``."""
    model = state.get(model_id, {})
    fields = model.get("state", {})
    if model.get("model_name") == "OutputModel":
        outputs.extend(fields.get("outputs", []))
    elif "description" in fields and ("value" in fields or "index" in fields):
        labels = fields.get("_options_labels")
        value = labels[fields["index"]] if labels and fields.get("index") is not None else fields.get("value")
        controls.append(f"{fields['description']} = {value}")
    for child in fields.get("children", []):
        _widget_parts(state, child.removeprefix("IPY_MODEL_"), controls, outputs)


def widget_snapshot(view, state):
    """The outputs a widget view showed when the notebook was executed, with a caption.

    A view of controls alone (``course_lib.widgets.panel`` stores its figure as an ordinary
    output beside them) becomes the caption alone.
    """
    controls, outputs = [], []
    _widget_parts(state, view.get("model_id", ""), controls, outputs)
    if not outputs and not controls:
        return []
    where = f" at {', '.join(controls)}" if controls else ""
    note = f'<p class="course-widget-note">Interactive in the notebook; shown here{where}.</p>'
    caption = nbformat.v4.new_output("display_data", data={"text/html": note})
    return [caption] + [nbformat.from_dict(o) for o in outputs]


def _is_caption(output):
    return "course-widget-note" in output.get("data", {}).get("text/html", "")


def offline_outputs(outputs, state):
    """``outputs`` with plotly figures as divs, widget views as static snapshots, and consecutive
    prints to the same stream joined (as the notebook shows them: one block, not one per print)."""
    result = []
    for output in outputs:
        data = output.get("data", {})
        previous = result[-1] if result else {}
        if output.get("output_type") == "stream" and previous.get("output_type") == "stream" \
                and previous.get("name") == output.get("name"):
            result[-1] = nbformat.from_dict(dict(previous, text=previous["text"] + output["text"]))
            continue
        if WIDGET_VIEW in data:
            snapshot = offline_outputs(widget_snapshot(data[WIDGET_VIEW], state), state)
            # A panel shows its controls in several views (a row of sliders, then the figure): one caption.
            result.extend(o for o in snapshot if not _is_caption(o) or not any(map(_is_caption, result)))
        elif PLOTLY_MIME in data:
            figure = nbformat.from_dict(dict(output, data={"text/html": plotly_html(data[PLOTLY_MIME])}))
            figure.metadata = {}
            result.append(figure)
        else:
            result.append(output)
    return result


def slide_type(cell):
    return cell.metadata.get("slideshow", {}).get("slide_type", "-")


def set_slide_type(cell, kind):
    cell.metadata["slideshow"] = {**cell.metadata.get("slideshow", {}), "slide_type": kind}


def tagged(cell, tag):
    return tag in cell.metadata.get("tags", [])


def code_to_notes(cell):
    """True when ``cell``'s code belongs in the speaker notes: it draws a figure or a widget, is long,
    or shows a result large (tagged ``slide-big`` or ``deck-answer``)."""
    drawn = any(PLOTLY_MIME in o.get("data", {}) or WIDGET_VIEW in o.get("data", {}) for o in cell.outputs)
    shown = tagged(cell, BIG) or tagged(cell, ANSWER)
    return bool(cell.source.strip()) and (drawn or shown or cell.source.strip().count("\n") >= CODE_LINES)


def notes_cell(cell):
    """A speaker-notes cell that shows ``cell``'s code."""
    fence = "~~~~" if "```" in cell.source else "```"
    return nbformat.v4.new_markdown_cell(f"{fence}python\n{cell.source.strip()}\n{fence}",
                                         metadata={"slideshow": {"slide_type": "notes"}})


def split_notes(cell):
    """A markdown cell as [its slide part, a notes cell with what follows the line ``<!-- notes -->``].

    A cell with nothing above the mark is notes alone; a notes or skipped cell only loses the mark.
    """
    lines = cell.source.split("\n")
    mark = next((i for i, line in enumerate(lines) if line.strip() == NOTES_MARK), None)
    if mark is None:
        return [cell]
    shown, notes = "\n".join(lines[:mark]).strip(), "\n".join(lines[mark + 1:]).strip()
    if slide_type(cell) in ("notes", "skip") or not shown:
        cell.source = "\n\n".join(part for part in (shown, notes) if part)
        if slide_type(cell) != "skip":
            set_slide_type(cell, "notes")
        return [cell]
    cell.source = shown
    if not notes:
        return [cell]
    spoken = nbformat.v4.new_markdown_cell(notes, metadata={"slideshow": {"slide_type": "notes"}})
    if cell.get("attachments"):
        spoken.attachments = cell.attachments
    return [cell, spoken]


def answer_last(cells):
    """``cells`` with those tagged ``deck-answer`` moved to the end, as one slide (fragments and notes kept)."""
    answer = [c for c in cells if tagged(c, ANSWER)]
    for i, cell in enumerate(answer):
        set_slide_type(cell, "slide" if i == 0 else slide_type(cell) if slide_type(cell) in ("fragment", "notes")
                       else "-")
    return [c for c in cells if not tagged(c, ANSWER)] + answer


def slides_of(cells):
    """The cells grouped as the audience sees them: one list per slide (each subslide its own), in order."""
    slides = []
    for cell in cells:
        kind = slide_type(cell)
        if kind == "skip":
            continue
        if not slides or (kind in STARTS and any(slide_type(c) != "notes" for c in slides[-1])):
            slides.append([])
        slides[-1].append(cell)
    return slides


def _heading_only(cell):
    return cell.cell_type == "markdown" and "\n" not in cell.source.strip() and cell.source.lstrip().startswith("#")


def _figure_alone(cell):
    """True for a code cell whose slide shows one figure (and a widget's caption) and nothing else."""
    if cell.cell_type != "code":
        return False
    if cell.source.strip() and not cell.metadata.get("transient", {}).get("remove_source"):
        return False  # its code is on the slide
    html = [o.get("data", {}).get("text/html", "") for o in cell.outputs]
    figures = [h for h in html if 'class="course-plotly"' in h]
    captions = [h for h in html if 'class="course-widget-note"' in h]
    return len(figures) == 1 and len(figures) + len(captions) == len(cell.outputs)


def fill_figures(cells):
    """Mark the figure of each slide that shows it alone (a heading above it allowed) to fill the
    slide's height: the deck's fitting script gives it the room the slide has left."""
    for slide in slides_of(cells):
        shown = [c for c in slide if slide_type(c) != "notes"]
        if shown and _figure_alone(shown[-1]) and (len(shown) == 1 or len(shown) == 2 and _heading_only(shown[0])):
            for output in shown[-1].outputs:
                html = output.get("data", {}).get("text/html", "")
                output.data["text/html"] = html.replace('class="course-plotly"', 'class="course-plotly course-fill"')


def check_question(cells):
    """Cells tagged ``deck-question`` must be on the deck's first slide."""
    slides = slides_of(cells)
    late = [i for i, slide in enumerate(slides[1:], start=2) for c in slide if tagged(c, QUESTION)]
    if late:
        raise ValueError(f"a cell tagged {QUESTION} is on slide {late[0]}: the lesson's question must be on the "
                         "first slide (tag the title cell, or a cell after it with slide type '-')")


def prepare(nb):
    """Make ``nb`` (in place) a deck: the marking convention applied, renderable with no widget
    manager and no network, code in the notes."""
    state = nb.metadata.pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    cells = []
    for cell in answer_last(nb.cells):
        if cell.cell_type == "markdown":
            cells.extend(split_notes(cell))
            continue
        cells.append(cell)
        if cell.cell_type != "code":
            continue
        notes = code_to_notes(cell)
        cell.outputs = offline_outputs(cell.outputs, state)
        if notes and slide_type(cell) not in ("skip", "notes"):
            cell.metadata.setdefault("transient", {})["remove_source"] = True
            cells.append(notes_cell(cell))
    check_question(cells)
    fill_figures(cells)
    nb.cells = cells
    return nb


def _printed_link(match):
    address, text = match.group(1), match.group(2)
    bare = address.split("://", 1)[1].rstrip("/")
    shown = re.sub(r"https?://", "", text).rstrip("/")
    if shown == bare:
        return f'<span class="course-address">{bare}</span>'
    return f'{text} <span class="course-address">({bare})</span>'


def offline_html(html):
    """Web links printed as addresses; CSS comments (licence URLs) and the obsolete IE meta dropped."""
    html = LINK.sub(_printed_link, html)
    html = re.sub(r"<meta[^>]*X-UA-Compatible[^>]*>\n?", "", html)
    return STYLE.sub(lambda m: m.group(1) + CSS_COMMENT.sub("", m.group(2)) + m.group(3), html)


def exporter():
    exp = SlidesExporter(template_file=str(SLIDES_DIR / "course.html.j2"))
    exp.reveal_url_prefix = f"{VENDOR}/reveal.js"
    exp.reveal_theme = "course"
    exp.reveal_transition = "none"
    exp.reveal_number = "c/t"
    exp.reveal_width, exp.reveal_height = str(WIDTH), str(HEIGHT)
    exp.require_js_url = f"{VENDOR}/require.js"
    exp.mathjax_url = f"{VENDOR}/mathjax/MathJax.js?config={MATHJAX_CONFIG}"
    exp.jquery_url = ""
    exp.exclude_input_prompt = exp.exclude_output_prompt = True
    exp.embed_images = True  # a markdown image travels inside the deck
    return exp


def build_deck(notebook, out, exp=None):
    """Write ``out/<notebook stem>.slides.html``; return its path."""
    notebook = pathlib.Path(notebook)
    try:
        nb = prepare(nbformat.read(notebook, as_version=4))
    except ValueError as error:
        raise ValueError(f"{notebook.name}: {error}") from None
    resources = {"metadata": {"name": notebook.stem, "path": str(notebook.parent)}, "course": {"vendor": VENDOR}}
    html, _ = (exp or exporter()).from_notebook_node(nb, resources=resources)
    html = offline_html(html)
    leaks = network_references(html)
    if leaks:
        raise RuntimeError(f"{notebook.name}: the deck refers to the network: {leaks[:3]}")
    deck = out / f"{notebook.stem}.slides.html"
    deck.write_text(html, encoding="utf-8")
    return deck


def lessons():
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def build(notebooks=None, out=ROOT / "slides"):
    """Build a deck for each notebook (default: every lesson) into ``out``; return their paths."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ensure_node_modules()
    copy_vendor(out)
    exp = exporter()
    return [build_deck(nb, out, exp) for nb in (notebooks or lessons())]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path, help="notebooks (default: notebooks/NN_*.ipynb)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "slides", help="output folder (default: slides/)")
    args = parser.parse_args(argv)
    if not (args.notebooks or lessons()):
        print("no lesson notebooks (notebooks/NN_*.ipynb) to build", file=sys.stderr)
        return 1
    for deck in build(args.notebooks, args.out):
        print(f"wrote {deck.relative_to(ROOT) if deck.is_relative_to(ROOT) else deck}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
