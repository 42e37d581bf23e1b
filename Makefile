# Set-up and test entry points (README.md gives the two commands a fresh machine needs).
# The project needs Python 3.12: take python3.12 from PATH if it runs, else a pyenv install of it.
PYTHON312 := $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-test test

$(PY):
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found (tried python3.12 and ~/.pyenv/versions/3.12*)"; exit 2; }
	$(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Core install: optuna, pandas, pyyaml (no torch), enough for the predicted loop on a laptop.
setup: $(PY)
	$(PY) -m pip install -q -e .

# Test install adds pytest, hypothesis, torch and megatron-core (for the Megatron cross-check).
setup-test: $(PY)
	$(PY) -m pip install -q -e '.[test]'

test: setup-test
	$(PY) -m pytest -q
