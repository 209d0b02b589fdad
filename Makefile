PY ?= python

.PHONY: test lint type bench golden demo fuzz sanitize

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

# Long fuzzing runs (the suite runs a few examples of each fuzzer); see docs/testing.md.
fuzz:
	TENSORDSL_FUZZ_EXAMPLES=$${TENSORDSL_FUZZ_EXAMPLES:-300} $(PY) -m pytest -p no:cacheprovider \
		tests/cpu/test_differential_fuzz.py tests/unit/test_parser_fuzz.py --hypothesis-show-statistics

# The corpus and its gradients with every kernel built with ASan and UBSan; see docs/testing.md.
sanitize:
	$(PY) -m tests.sanitize
