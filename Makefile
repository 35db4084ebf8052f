# The two commands of the README:  `make demo`  and  `make test`.
# Both create the virtual environment, install the project and provision a
# RabbitMQ broker ($OJS_AMQP_URL, else Docker, else a private local node of RabbitMQ
# $OJS_RABBITMQ: 4.3 by default, 4.0 and 3.10 too; 4.x runs from Debian chroots built once
# into ~/.cache/ojs-kombu, DESIGN §18);
# `setup` also installs, with the repository's own tools (tools/, not in the wheel), redis-server
# (Celery's Redis result backend in the tests), a Java runtime for PySpark (ojs_kombu.spark) and
# Chromium with its driver (the dashboard's browser tests).
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
	$(PY) -m tools.redis install
	$(PY) -m tools.java install
	$(PY) -m tools.browser install
	rm -f $(VENV)/.installed-* && touch $@

demo: setup
	$(PY) -m ojs_kombu.testing.broker run -- $(PY) examples/demo.py

# Lint and format (ruff), the layer contracts (import-linter, DESIGN §17), types (mypy) and the size
# rule of issue 28 (tools/sizes.py: no module over 700 lines, class over 500, function over 80).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m tools.sizes

# Every test runs on RabbitMQ 4.3 ($OJS_RABBITMQ); then the modules whose behaviour depends on
# the broker's version (retries, scheduling, dead letters, control streams, quorum queues, Celery,
# Dramatiq, clusters) run again on 3.10.8, the host's package.  The peer suites (Celery's and
# Dramatiq's own tests, ~9 of the ~22 minutes) run on 4.3 only.  Skipped when $OJS_AMQP_URL names
# a broker (nothing to switch) or when the first pass already ran on 3.10.
VERSIONED_TESTS := tests/broker/test_dead_letters.py tests/broker/test_worker_conformance.py \
	tests/broker/test_transport_settle.py tests/broker/test_quorum.py tests/broker/test_control.py \
	tests/broker/test_pause.py tests/broker/test_info.py tests/broker/test_presence.py \
	tests/broker/test_topology.py tests/broker/test_cron_leader.py tests/broker/test_unique_locks.py tests/broker/test_fan_in.py tests/broker/test_permits.py tests/celery tests/dramatiq tests/cluster
PEER_SUITES := --ignore=tests/celery/test_celery_suite.py --ignore=tests/dramatiq/test_dramatiq_peer_suite.py

test: lint docs
	$(PY) -m pytest -q -ra --durations=40 $(PYTEST_ARGS)
	@if [ -z "$$OJS_AMQP_URL" ] && [ "$${OJS_RABBITMQ:-4.3}" != 3.10 ]; then \
		echo "== the version-sensitive modules again, on RabbitMQ 3.10"; \
		OJS_RABBITMQ=3.10 $(PY) -m pytest -q -ra --durations=20 $(PEER_SUITES) $(VERSIONED_TESTS); \
	fi

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on any warning (broken link, bad reference).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

unit: setup
	$(PY) -m pytest -q tests/unit

bench: setup
	$(PY) -m ojs_kombu.testing.broker run -- sh -c '$(PY) benchmarks/publish.py && $(PY) benchmarks/control.py'

clean:
	rm -rf $(VENV) .cache .pytest_cache site
