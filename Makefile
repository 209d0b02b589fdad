PY ?= python

.PHONY: test test-emulator-full lint type bench golden demo

test:
	$(PY) -m pytest

# Every candidate GPU schedule, dtype and scheduling order of every corpus nest, and the
# whole corpus through JAX, under the CUDA emulator (tests/gpu; much longer than `test`).
test-emulator-full:
	TENSORDSL_EMULATOR_FULL=1 $(PY) -m pytest tests/gpu

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
