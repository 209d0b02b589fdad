"""Which gradient nests run paired on CUDA (`codegen.cuda.attention.paired`): read from the nests a
forward+backward call of causal attention traces on the cuda back end (no kernel runs)."""

from __future__ import annotations

import pytest

from codegen.cuda.layout import split_paired
from tests.programs import PROGRAMS_BY_NAME


def _labels(shape: tuple[int, ...], dtype: str, value: tuple[int, ...] | None = None) -> list:
    import tensordsl as td
    from tensordsl.explain.timing import nest_equations

    k = td.kernel(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"))
    shapes = {"Q": shape, "K": shape, "scale": (), "V": value or shape}
    jaxpr = k._call_jaxpr(shapes, dtype, backend="cuda")
    return [eqn.params["nest"].label for eqn in nest_equations(jaxpr)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dk_and_dv_run_as_one_nest_and_dq_alone(dtype):
    labels = _labels((2, 3, 300, 64), dtype)
    assert "dV_dK" in labels and "dQ" in labels
    assert "dK" not in labels and "dV" not in labels


@pytest.mark.parametrize(
    ("shape", "value", "dtype"),
    [
        ((2, 3, 300, 128), None, "float32"),  # 256 columns: two passes, no gain
        ((2, 3, 300, 64), (2, 3, 300, 72), "float32"),  # 136 columns
        ((2, 3, 300, 64), None, "float64"),  # past the static shared memory
    ],
)
def test_no_pair_where_it_would_not_pay_or_fit(shape, value, dtype):
    labels = _labels(shape, dtype, value)
    assert "dK" in labels and "dV" in labels and "dV_dK" not in labels


def test_the_setting_turns_pairs_off(monkeypatch):
    monkeypatch.setenv("TENSORDSL_PAIR_GRADIENTS", "0")
    assert "dV_dK" not in _labels((2, 3, 300, 64), "float32")


def test_split_paired_reads_only_the_packed_form():
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    nest = lower(parse("O[i,e] := where(e < 3, A[i,j]*B[j,e], A[i,j]*C[j,e])")).nest
    assert split_paired(nest) is None  # no nested sum in the weights: not split_weighted's
