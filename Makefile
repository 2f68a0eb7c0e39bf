# Two commands do everything on a fresh machine (Python 3.11+, JDK 17+, Maven):
#   make demo   -- local Kafka broker, a dpstream worker, synthetic users, live private counts
#   make test   -- the whole test suite, integration tests against a real broker included
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test unit lint install broker-jars clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,demo]'
	touch $(STAMP)

install: $(STAMP)

broker-jars: $(STAMP)
	$(VENV)/bin/dpstream broker fetch

demo: $(STAMP) broker-jars
	$(VENV)/bin/dpstream demo

test: $(STAMP) broker-jars
	$(PY) -m pytest $(PYTEST_ARGS)

unit: $(STAMP)
	$(PY) -m pytest -m "not integration and not statistical"

lint: $(STAMP)
	$(VENV)/bin/ruff check operators pipeline config tests

clean:
	rm -rf $(VENV) deploy/.cache .dpstream demo-out
