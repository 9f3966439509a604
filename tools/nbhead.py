"""Write the head of every notebook: an "Open in Colab" badge and a Colab-only install cell.

The repository and the ref (a tag or commit) come from one place, ``[tool.course]`` in
``pyproject.toml``.  The install cell does nothing outside Colab; on Colab it installs the
course package with torch and numpy pinned to the versions Colab already has, so pip can
never replace them.

    python tools/nbhead.py [PATH ...]  rewrite the heads (default: notebooks/, solutions/, exercises/)
    python tools/nbhead.py --check     exit 1 if any head is missing or stale
"""

import argparse
import pathlib
import sys
import tomllib

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("notebooks", "solutions", "exercises")
BADGE_TAG, INSTALL_TAG = "colab-badge", "colab-install"
KEEP_FILE = "/tmp/course-keep.txt"
PACKAGE = "efficient-attention-course"
GITHUB = "https://github.com/"


def course_config():
    """``(repository, ref)`` from pyproject.toml's ``[tool.course]``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["course"]
    return config["repository"].rstrip("/"), config["ref"]


def install_requirement():
    """The pip requirement that installs the course package on Colab."""
    repository, ref = course_config()
    return f"{PACKAGE} @ git+{repository}@{ref}"


def badge_markdown(relpath):
    """The badge that opens ``relpath`` (e.g. ``notebooks/01_x.ipynb``) in Colab."""
    repository, ref = course_config()
    if not repository.startswith(GITHUB):
        raise ValueError(f"[tool.course] repository must be on GitHub for Colab to open it: {repository}")
    github = repository.removeprefix(GITHUB)
    url = f"https://colab.research.google.com/github/{github}/blob/{ref}/{relpath}"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


def install_source():
    """The Colab install cell's code; it installs exactly ``install_requirement()``."""
    repository, ref = course_config()
    return (
        "# Colab only: install the course package; Colab's own torch and numpy are kept as they are.\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        "    import importlib\n"
        "    import subprocess\n"
        "    from importlib.metadata import version\n"
        "\n"
        f'    with open("{KEEP_FILE}", "w") as keep:  # pins: pip may not replace these\n'
        '        keep.write("\\n".join(f"{name}=={version(name)}" for name in ("torch", "numpy")))\n'
        f'    package = "{PACKAGE} @ git+{repository}"\n'
        f'    pip = [sys.executable, "-m", "pip", "install", "--quiet", "-c", "{KEEP_FILE}"]\n'
        f'    subprocess.run([*pip, f"{{package}}@{ref}"], check=True)\n'
        "    importlib.invalidate_caches()  # so this running kernel finds the new package"
    )


def _tagged(cell, tag):
    return tag in cell.get("metadata", {}).get("tags", [])


def apply_head(nb, relpath):
    """Put the badge (cell 0) and the install cell (cell 1) at the top of ``nb``, in place."""
    nb.cells = [c for c in nb.cells if not (_tagged(c, BADGE_TAG) or _tagged(c, INSTALL_TAG))]
    badge = nbformat.v4.new_markdown_cell(badge_markdown(relpath))
    badge.metadata = {"tags": [BADGE_TAG], "slideshow": {"slide_type": "skip"}}
    install = nbformat.v4.new_code_cell(install_source())
    install.metadata = {"tags": [INSTALL_TAG], "slideshow": {"slide_type": "skip"}}
    badge.id, install.id = BADGE_TAG, INSTALL_TAG  # fixed ids: regenerating changes nothing
    nb.cells[:0] = [badge, install]
    return nb


def head_is_current(nb, relpath):
    """True when ``nb`` starts with this repository's badge and install cell."""
    if len(nb.cells) < 2:
        return False
    badge, install = nb.cells[0], nb.cells[1]
    skipped = all(c.get("metadata", {}).get("slideshow", {}).get("slide_type") == "skip" for c in (badge, install))
    return (skipped and _tagged(badge, BADGE_TAG) and badge.source == badge_markdown(relpath)
            and _tagged(install, INSTALL_TAG) and install.source == install_source())


def notebooks():
    for folder in FOLDERS:
        yield from sorted((ROOT / folder).glob("*.ipynb"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=pathlib.Path, help="notebooks (default: all)")
    parser.add_argument("--check", action="store_true", help="report stale heads, change nothing")
    args = parser.parse_args(argv)
    stale = []
    for path in [p.resolve() for p in args.paths] or notebooks():
        relpath = path.relative_to(ROOT).as_posix()
        nb = nbformat.read(path, as_version=4)
        if head_is_current(nb, relpath):
            continue
        stale.append(relpath)
        if not args.check:
            install_cell = next((c for c in nb.cells if _tagged(c, INSTALL_TAG)), None)
            apply_head(nb, relpath)
            if install_cell is not None:  # keep the stored run of the install cell
                nb.cells[1].execution_count = install_cell.get("execution_count")
                nb.cells[1].outputs = install_cell.get("outputs", [])
            nbformat.write(nb, path)
    for relpath in stale:
        print(("stale head: " if args.check else "rewrote head: ") + relpath)
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
