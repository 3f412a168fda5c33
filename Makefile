# The README's two commands: `make demo` and `make test`. Everything else they need is built here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
VENV_STAMP := $(VENV)/.installed
# the processes make test runs the test files in (pytest-xdist); each starts its own broker and PostgreSQL
TEST_WORKERS ?= 2
JARS_STAMP := .cache/jars/.complete
JAVA_SOURCES := $(shell find connector/src/main -name '*.java' 2>/dev/null)
# the contract is packaged into the connector jar
CONTRACT := $(wildcard schemas/*)

.PHONY: all setup system-packages venv jars jaeger demo test test-fast test-java lint typecheck chaos chaos-brokers clean kafka-start kafka-stop bench bench-full bench-slo

all: test

setup: system-packages venv jars jaeger

# Servers and tools the tests run, from Debian's packages, installed only where missing:
# PostgreSQL (initdb/pg_ctl start a throwaway cluster for the shared status store's tests),
# promtool (package prometheus: alert rules) and docker-compose (validates docker-compose.yml
# without an engine), redis-server (the Redis-backed engine and the benchmark's Redis peer), and
# chromium with chromium-driver (the API's support page is tested in a real headless browser).
# Installing needs root (or password-less sudo).
PG_BINARIES := $(wildcard /usr/lib/postgresql/*/bin/initdb)
system-packages:
	@missing=""; \
	command -v initdb >/dev/null 2>&1 || [ -n "$(PG_BINARIES)" ] || missing="$$missing postgresql"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	command -v docker-compose >/dev/null 2>&1 || missing="$$missing docker-compose"; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	command -v go >/dev/null 2>&1 || missing="$$missing golang-go"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; \
	  else echo "missing Debian packages:$$missing (install them as root: apt-get install$$missing)" >&2; exit 1; fi; \
	  echo "installing Debian packages:$$missing"; \
	  $$sudo apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

venv: $(VENV_STAMP)
$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $@

# Jaeger (the traces' collector and query API in the tests, harness/local_jaeger.py), built once from
# the Go module proxy into .cache/jaeger/<version>/ (pinned as a tool of tools/jaeger/go.mod: its own
# go.mod has replace directives, so `go install ...@version` refuses it; golang-go from Debian's
# packages where no Go is installed).
JAEGER_VERSION := v1.76.0
JAEGER_BIN := .cache/jaeger/$(JAEGER_VERSION)/jaeger
jaeger: $(JAEGER_BIN)
$(JAEGER_BIN): tools/jaeger/go.mod tools/jaeger/go.sum
	cd tools/jaeger && go build -trimpath -o $(CURDIR)/$(JAEGER_BIN) github.com/jaegertracing/jaeger/cmd/jaeger

# Jars from Maven Central (pom.xml): the Kafka broker, the Flink Kafka connector, our adapters.
jars: $(JARS_STAMP)
$(JARS_STAMP): pom.xml $(JAVA_SOURCES) $(CONTRACT)
	mvn -q -B package -DskipTests
	touch $@

demo: setup
	$(BIN)/dedupctl demo

test: setup test-java
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# the connector's JUnit tests, the contract's shared vectors (tests/vectors.json) among them
test-java: jars
	mvn -q -B test

test-fast: setup
	$(BIN)/python -m pytest -m "not integration"

lint: venv
	$(BIN)/ruff check dedupctl jobs operators senders settings ops harness api bench tests

typecheck: venv
	$(BIN)/mypy

kafka-start: setup
	$(BIN)/dedupctl kafka start && $(BIN)/dedupctl topics create

kafka-stop: venv
	$(BIN)/dedupctl kafka stop

clean:
	rm -rf .cache/build .data

# Fault injection at full size: >= 20 SIGKILLs over 200,000 requests, a broker restart, rescales.
chaos: setup
	$(BIN)/dedupctl chaos --requests 200000 --rate 1000 --kills 20 --broker-restarts 1 --rescales 2

# The same on three brokers (replication 3, min.insync.replicas 2): SIGKILLs of the busiest node
# mid-stream, each kept down past its fencing and started again, besides job kills and rescales.
chaos-brokers: setup
	$(BIN)/dedupctl chaos --brokers 3 --requests 100000 --rate 1000 --kills 10 --broker-kills 3 --broker-restarts 1 --rescales 2

# The job against its peers and the exactly-once ceiling (bench/README.md): quick (about 10 min,
# two interleaved rounds) and full (three rounds of every system, about an hour); then the API's
# accept latency and the delivery benchmark (bench.senders: the senders against provider stubs).
# Both need the `bench` extra (Quix Streams, redis, matplotlib, psutil, the stubs' h2, httptools,
# aiosmtpd) on top of the setup; a missing redis-server is
# installed from Debian's packages by the benchmark itself (or that peer is skipped).
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(VENV_STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[test,dev,bench]'
	touch $@

bench: setup $(BENCH_STAMP)
	$(BIN)/python -m bench.run --quick
	$(BIN)/python -m bench.api
	$(BIN)/python -m bench.senders

bench-full: setup $(BENCH_STAMP)
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.senders --full
	$(MAKE) bench-slo

# The service levels end to end (issue 22, bench/README.md): broker, job, senders, API as dedupctl
# runs them, provider stubs at 200 ms; accept latency at 1,000 and 2,000/s, one-time codes and order
# updates beside a 100,000-user campaign, lost requests and repeated provider calls.
bench-slo: setup $(BENCH_STAMP)
	$(BIN)/python -m bench.slo --full
