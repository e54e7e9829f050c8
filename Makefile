# Two commands set up and run everything on a fresh machine: `make fig7` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test clean

setup: $(STAMP)

# Reinstall only when the project's dependencies change; a second `make setup` does nothing.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) .pytest_cache
