# Efficient Attention, from the Ground Up.
#   make lab    set up .venv, then open JupyterLab on lesson 00
#   make test   set up .venv, then run every check CI runs
# Every install goes through constraints.txt (torch pinned to 2.13.0).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/python -m pip
LAB_ARGS ?=
# JupyterLab refuses to start as root (containers, CI) unless told that it is intended.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
FIRST_LESSON := $(firstword $(NOTEBOOKS))

# Tests and notebooks never touch the network: models load from installed packages only.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export JUPYTER_PLATFORM_DIRS := 1
export PYDEVD_DISABLE_FILE_VALIDATION := 1
export PYTHONHASHSEED := 0

.PHONY: venv lab test lint unit notebooks solutions exercises-run portability exercises check-exercises \
        nbhead slides slide-measures constraints clean

venv: $(STAMP)

# Rebuilt only when the dependencies change; safe to run again and again.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade -c constraints.txt pip setuptools
	$(PIP) install --quiet -c constraints.txt -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (course)" >/dev/null
	@touch $@

# The server's root is the repository, so notebooks/, exercises/ and solutions/ are all in the
# file browser; lesson 00 opens first.  (A file argument would make its folder the root.)
lab: venv
	$(BIN)/jupyter-lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/$(FIRST_LESSON) $(ROOT_FLAG) $(LAB_ARGS)

test: venv lint unit notebooks solutions exercises-run
	@echo "make test: all checks passed"

lint: venv
	$(BIN)/ruff check .

# Unit tests, plus the notebook-hygiene tests (executed in order, exercises in sync).
unit: venv
	$(BIN)/python -m pytest tests -q

# Lessons and solutions run top to bottom; every stored output is compared.
notebooks: venv
	$(BIN)/python -m pytest --nbval notebooks --nbval-sanitize-with tools/nbval_sanitize.cfg -q

solutions: venv
	$(BIN)/python -m pytest --nbval solutions --nbval-sanitize-with tools/nbval_sanitize.cfg -q

# The lessons and solutions validated again under a second numeric configuration: one thread,
# other OpenBLAS kernels, ATen's portable kernels.  Sums run in another order, as on a learner's
# CPU; the stored outputs must still match (CI runs this after make test).
ALT_NUMERICS := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=Sandybridge \
                ATEN_CPU_CAPABILITY=default
portability: venv
	$(ALT_NUMERICS) $(MAKE) --no-print-directory notebooks solutions

# Untouched exercise notebooks must run to the end and report "not attempted".
exercises-run: venv
	$(BIN)/python -m pytest --nbval-lax exercises -q

# Grade a learner's exercise notebooks: a table per exercise, and grades.json for the instructor.
#   make grade GRADE_DIR=path/to/learner   (exit code 0 only when every exercise passed)
GRADE_DIR ?= exercises
.PHONY: grade
grade: venv
	$(BIN)/python -m course_lib.grade $(GRADE_DIR)

# Regenerate exercises/ from solutions/ (stubs replace the solution regions).
exercises: venv
	$(BIN)/python tools/make_exercises.py

# Rewrite the Colab badge and install cell of every notebook from pyproject's [tool.course].
nbhead: venv
	$(BIN)/python tools/nbhead.py

# Lecture decks, one per lesson, that open offline: slides/NN_*.slides.html (+ slides/vendor/).
# reveal.js, MathJax 2 and require.js come from tools/slides/package-lock.json (npm ci when needed).
slides: venv
	$(BIN)/python tools/build_slides.py

# Every slide of every deck measured as an audience sees it (headless chromium, offline): visible
# words, fill, figure or equation; one line a slide, three screenshots a deck in build/screenshots/.
slide-measures: venv
	$(BIN)/python tools/measure_slides.py --strict --slides --screenshots build/screenshots

# Re-resolve the pinned versions after a change to pyproject.toml's dependencies.
constraints:
	rm -rf .constraints-venv && $(PYTHON) -m venv .constraints-venv
	.constraints-venv/bin/pip install --quiet "torch==2.13.0" -e ".[dev]"
	{ sed -n '1,/^$$/p' constraints.txt | grep '^#'; .constraints-venv/bin/pip freeze --exclude-editable \
	  | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/'; } > constraints.new && mv constraints.new constraints.txt
	rm -rf .constraints-venv

clean:
	rm -rf $(VENV) slides/*.html slides/vendor tools/slides/node_modules .pytest_cache .ruff_cache
