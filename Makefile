PY ?= python

.PHONY: test test-emulator-full lint type bench bench-layers bench-quick golden demo fuzz sanitize

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

bench: bench-layers
	$(PY) -m benchmarks.run_cpu

# The layer-level benchmarks (issues 14, 15): each rewrites only its own marked section of
# RESULTS.md, and run_cpu keeps those sections when it rewrites the rest, so order is free.
bench-layers:
	$(PY) -m benchmarks.gpt_block
	$(PY) -m benchmarks.gaussian
	$(PY) -m benchmarks.attention
	$(PY) -m benchmarks.vector_math
	$(PY) -m benchmarks.nn_layers

# Smoke runs at tiny sizes (< 60 s each); they write nothing.
bench-quick:
	$(PY) -m benchmarks.run_cpu --quick --no-memory
	$(PY) -m benchmarks.gpt_block --quick
	$(PY) -m benchmarks.gaussian --quick
	$(PY) -m benchmarks.attention --quick
	$(PY) -m benchmarks.vector_math --quick
	$(PY) -m benchmarks.nn_layers --quick

golden:
	TENSORDSL_UPDATE_GOLDEN=1 $(PY) -m pytest tests -k golden

demo:
	$(PY) -m tensordsl demo

# Long fuzzing runs (the suite runs a few examples of each fuzzer); see docs/testing.md.
fuzz:
	TENSORDSL_FUZZ_EXAMPLES=$${TENSORDSL_FUZZ_EXAMPLES:-300} $(PY) -m pytest -p no:cacheprovider \
		tests/cpu/test_differential_fuzz.py tests/unit/test_parser_fuzz.py --hypothesis-show-statistics

# The corpus and its gradients with every kernel built with ASan and UBSan; see docs/testing.md.
sanitize:
	$(PY) -m tests.sanitize
