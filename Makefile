# Two commands do everything on a fresh machine (Python 3.11+, JDK 17+, Maven):
#   make demo   -- local Kafka broker, a dpstream worker, synthetic users, live private counts
#   make test   -- the whole test suite, integration tests against a real broker included
# With Docker (see README): make compose-up -- broker + worker in containers; make images.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# docker compose (the plugin) where it answers, else docker-compose (v1, e.g. Debian's).
COMPOSE ?= $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)
COMPOSE_FILE := deploy/docker-compose.yml
# apache/kafka from Docker Hub; dpstream/kafka:4.1.1 (make images) where no registry answers.
KAFKA_IMAGE ?= $(or $(DPSTREAM_KAFKA_IMAGE),apache/kafka:4.1.1)

.PHONY: demo test unit lint install broker-jars browser schemas images compose-up compose-down clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,demo,schema-registry,pandas]'
	touch $(STAMP)

install: $(STAMP)

broker-jars: $(STAMP)
	$(VENV)/bin/dpstream broker fetch

demo: $(STAMP) broker-jars
	$(VENV)/bin/dpstream demo

# Two pytest processes, a test module each at a time (--dist loadfile: a module's tests keep
# their order and its module fixtures), each with its own broker; TEST_WORKERS=0 runs one.
TEST_WORKERS ?= 2

test: $(STAMP) broker-jars
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

unit: $(STAMP)
	$(PY) -m pytest -m "not integration and not statistical"

# Headless Chromium and its driver from Debian's packages, for the dashboard's browser test
# (tests/integration/test_dashboard.py); .ci/run calls this. Needs root (apt-get) once.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
		echo "chromium and chromedriver: installed"; \
	else \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends chromium chromium-driver; \
	fi

# The published JSON Schemas and the release topics' Avro schemas (docs/schemas/) from
# statistics/releases.py, where the releases and ledger entries are built;
# tests/client/test_schemas.py and tests/statistics/test_avro_schemas.py fail when they differ.
schemas: $(STAMP)
	$(PY) -m dpstream.client.schemas --out docs/schemas

# Lint and formatting of every Python folder; formatting is checked, never rewritten here.
# Then the type hints of the installed packages ([tool.mypy] in pyproject.toml says which).
LINT_DIRS := operators statistics pipeline client config deploy testing tests bench experiments

# The repository root is the dpstream package (setuptools' package-dir), and the packages
# import one another as dpstream.<package>. mypy cannot follow the editable install's import
# hook, so it reads them through $(MYPY_ROOT)/dpstream, a link to the root, as
# dpstream.<package> (mypy_path in pyproject.toml): every module once, under the name it
# is imported by, and nothing else of the root (tests, bench, experiments, .venv).
MYPY_ROOT := .mypy-root

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(VENV)/bin/ruff format --check $(LINT_DIRS)
	mkdir -p $(MYPY_ROOT) && ln -sfn .. $(MYPY_ROOT)/dpstream
	$(VENV)/bin/mypy

# The broker and worker images from the project's own files (debootstrap: root needed once).
images: $(STAMP) broker-jars
	PYTHON=$(PY) deploy/images.sh

# Broker and worker from deploy/docker-compose.yml; the worker image is built if missing.
# The noise key comes from the environment: DPSTREAM_NOISE_KEY="$$(cat noise.key)".
compose-up:
	DPSTREAM_KAFKA_IMAGE=$(KAFKA_IMAGE) $(COMPOSE) -f $(COMPOSE_FILE) up -d

compose-down:
	DPSTREAM_NOISE_KEY=unused $(COMPOSE) -f $(COMPOSE_FILE) down

clean:
	rm -rf $(VENV) deploy/.cache .dpstream demo-out $(MYPY_ROOT)
