# The two commands of the README's Quick start.  Each creates .venv if it is
# missing, installs the project with everything it needs, then runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test sweep setup tfp clean docs lint typecheck format-check dist

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# The sweep matrices (tests/sweeps/, marked `sweep`, deselected by `make test`):
# hours of fresh-process Paddle runs; one cell is one test id.
sweep: $(STAMP)
	$(BIN)/python -m pytest -q -m sweep tests/sweeps

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[all]"
	touch $(STAMP)

# TensorFlow Probability 0.25 for benchmarks/bench_autobatch_tf.py's side-by-side
# runs.  It needs TensorFlow 2.18, which cannot live beside this project's
# TensorFlow, hence a venv of its own (the bench finds it there).
TFP_VENV := .tfp-venv

tfp: $(TFP_VENV)/.installed

$(TFP_VENV)/.installed:
	test -x $(TFP_VENV)/bin/python || $(PYTHON) -m venv $(TFP_VENV)
	$(TFP_VENV)/bin/python -m pip install "tensorflow-cpu==2.18.1" "tf-keras==2.18.0" \
		"tensorflow-probability==0.25.0" "numpy<2.1"
	touch $@

# The documentation site (docs/, Sphinx): warnings are errors.
docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

# ruff's rule set and mypy's strict core: both configured in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Not yet part of CI: the tree has not had its one mass reformat.
format-check: $(STAMP)
	$(BIN)/ruff format --check .

# The sdist and wheel users install, in dist/.
dist: $(STAMP)
	$(BIN)/python -m build -o dist .

clean:
	rm -rf $(VENV) $(TFP_VENV) build dist docs/_build *.egg-info
