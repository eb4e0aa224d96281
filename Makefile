# The two commands of the README's Quick start.  Each creates .venv if it is
# missing, installs the project with everything it needs, then runs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test setup clean

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

setup: $(STAMP)

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[all]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
