# Set-up and test entry points (README.md gives the two commands a fresh machine needs).
# The project needs Python 3.12: take python3.12 from PATH if it runs, else a pyenv install of it.
PYTHON312 := $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
# Ray's wheel ships its own `tune` script (Ray Tune), and pip installs Ray after attune when an extra brings
# Ray into an existing install, so Ray's would own bin/tune: every target that installs an extra re-installs
# attune's scripts last (no dependencies: a few seconds).
OWN_SCRIPTS := $(PY) -m pip install -q --no-deps --force-reinstall -e .

# Installs go through uv (a pip-compatible installer, itself installed with pip into the venv): it downloads in
# parallel, so the test install with CUDA torch takes seconds where pip took minutes. It follows the constraint file
# pip is configured with, if any, so both resolve the same; where uv cannot be had, pip installs.
PIP_CONSTRAINT := $(shell $(PYTHON312) -m pip config get global.constraint 2>/dev/null)
UV := $(VENV)/bin/uv
# $(call install,ARGS): uv installs ARGS, pip where uv fails
install = $(UV) pip install -q --python $(PY) $(if $(PIP_CONSTRAINT),--constraint $(PIP_CONSTRAINT)) $(1) || \
	$(PY) -m pip install -q $(1)

.PHONY: setup setup-ray setup-test setup-test-fast test test-fast

$(PY):
	@test -n "$(PYTHON312)" || { echo "Python 3.12 not found (tried python3.12 and ~/.pyenv/versions/3.12*)"; exit 2; }
	$(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(UV): | $(PY)
	$(PY) -m pip install -q uv || echo "uv not installed: pip installs instead"

# Core install: optuna, pandas, pyyaml (no torch), enough for the predicted loop on a laptop.
setup: $(UV)
	$(call install,-e .)

# Real trials: adds Ray (the slime runner's Jobs API, the megatron runner's placement groups).
setup-ray: $(UV)
	$(call install,-e '.[ray]')
	$(OWN_SCRIPTS)

# Test install adds pytest, hypothesis, torch and megatron-core (for the Megatron cross-check), and ray.
setup-test: $(UV)
	$(call install,-e '.[test]')
	$(OWN_SCRIPTS)

# Two workers, a test file whole on one of them (its module fixtures, a Ray cluster or a PostgreSQL server, start once).
# Three on two cores were no faster (616 s against 563-622 s).
XDIST := -n 2 --dist loadfile
# The suite starts many Python processes (tune runs, workers): with PYTHONDONTWRITEBYTECODE set in the shell each of
# them compiles our modules again, and pytest re-rewrites every test file's asserts. The tests write bytecode.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q $(XDIST)

test: setup-test
	$(PYTEST)

# The quick subset for the edit-test loop: no test marked slow, ray or torch (pyproject.toml lists the markers); it
# installs no torch (an existing one is left alone).
setup-test-fast: $(UV)
	$(call install,-e '.[test-fast]')
	$(OWN_SCRIPTS)

test-fast: setup-test-fast
	$(PYTEST) -m "not slow and not ray and not torch"
