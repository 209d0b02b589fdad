PY ?= python

.PHONY: test lint type bench golden demo

test:
	$(PY) -m pytest

lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

type:
	$(PY) -m mypy

bench:
	$(PY) -m benchmarks.run_cpu

golden:
	TENSORDSL_UPDATE_GOLDEN=1 $(PY) -m pytest tests -k golden

demo:
	$(PY) -m tensordsl demo
