# Every target installs what it needs into .venv first (scripts/bootstrap.sh).
SHELL := /bin/bash
PY := .venv/bin/python
export RAY_USAGE_STATS_ENABLED := 0
# Tools spawned by name (`ray`, used by ray.util.spark) must come from .venv.
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: venv demo test test-unit test-component test-integration bench-startup bench-startup-standalone bench-training bench-chaos bench-scaling bench-connect bench-estimators bench-horovod bench-scale bench-gpu bench-suite-jvm bench-spark-tasks refresh-originals lint

venv:
	@bash scripts/bootstrap.sh

## The main job: start an embedded cluster, train a small model on it, tear it down.
demo: venv
	$(PY) examples/quickstart.py

## The whole test suite, every tier (real Spark local-cluster, real Ray); tests/README.md.
test: venv
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

## The fast loops, one tier each (tests/README.md): in-process only (< 2 min) ...
test-unit: venv
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 -m unit tests

## ... real supervisors, channels, forkers and in-process servers, no Spark (< 3 min) ...
test-component: venv
	$(PY) -m pytest -q -p no:cacheprovider --durations=10 -m component tests

## ... and real Spark and Ray.
test-integration: venv
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -m integration tests

bench-training: venv
	$(PY) benchmarks/training.py

## A run's ranks in Spark barrier tasks (no Ray): raydist's launcher against pyspark's.
bench-spark-tasks: venv
	$(PY) benchmarks/spark_tasks.py

bench-startup: venv
	$(PY) benchmarks/startup.py

bench-startup-standalone: venv
	$(PY) benchmarks/startup.py --master standalone

bench-chaos: venv
	$(PY) benchmarks/chaos.py --seconds 90

bench-scaling: venv
	$(PY) benchmarks/scaling.py

bench-connect: venv
	$(PY) benchmarks/connect.py

bench-estimators: venv
	$(PY) benchmarks/estimators.py

bench-horovod: venv
	$(PY) benchmarks/horovod.py

bench-scale: venv
	$(PY) benchmarks/scale.py

## GPU runs against pyspark's; says why and exits 0 where there is no GPU.
bench-gpu: venv
	$(PY) benchmarks/gpu.py

## CPU of one Spark start with the JVM's defaults and with the suite's options (tests/jvm.py).
bench-suite-jvm: venv
	$(PY) benchmarks/suite_jvm.py

## Record what pyspark's own classes give the programs the tests compare with (tests/originals.json).
refresh-originals: venv
	$(PY) -m tests.refresh_originals $(PROGRAMS)

lint: venv
	$(PY) -m ruff check raydist tests benchmarks examples
