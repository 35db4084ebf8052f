# The two commands of the README:  `make demo`  and  `make test`.
# Both create the virtual environment, install the project and provision a
# RabbitMQ broker ($OJS_AMQP_URL, else Docker, else a private local node of RabbitMQ
# $OJS_RABBITMQ: 4.3 by default, 4.0 and 3.10 too; 4.x runs from Debian chroots built once
# into ~/.cache/ojs-kombu, DESIGN §18);
# `setup` also installs redis-server (Celery's Redis result backend in the tests) and a Java
# runtime for PySpark (ojs_kombu.spark).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: setup demo lint test unit docs bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,celery,dramatiq,spark,docs,dashboard]'
	$(PY) -m ojs_kombu.testing.broker install --rabbitmq 4.3 --rabbitmq 4.0 --rabbitmq 3.10
	$(PY) -m ojs_kombu.testing.redis install
	$(PY) -m ojs_kombu.testing.java install
	$(PY) -m ojs_kombu.testing.browser install
	rm -f $(VENV)/.installed-* && touch $@

demo: setup
	$(PY) -m ojs_kombu.testing.broker run -- $(PY) examples/demo.py

# Lint and format (ruff), the layer contracts (import-linter, DESIGN §17) and types (mypy).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: lint docs
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on any warning (broken link, bad reference).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

unit: setup
	$(PY) -m pytest -q tests/unit

bench: setup
	$(PY) -m ojs_kombu.testing.broker run -- sh -c '$(PY) benchmarks/publish.py && $(PY) benchmarks/control.py'

clean:
	rm -rf $(VENV) .cache .pytest_cache site
