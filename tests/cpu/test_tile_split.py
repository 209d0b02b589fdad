"""A tested tile splits a reduced loop that its one lane constraint bounds: the part where the
constraint holds for every row and lane of the tile runs untested, the rest is tested per
lane (`codegen.c.tiles.tiles._tested_parts`). Values and gradients against the reference back end
in float64, for constraints with a coefficient, two reduced indices, an offset, and scores
recomputed inside a program."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen import config

pytestmark = pytest.mark.skipif(shutil.which(config.c_compiler()) is None, reason="no C compiler")

CASES = [
    ("Y[i,p] := X[j,p]*W[k,p]*(j + k <= i)", {"X": (13, 70), "W": (5, 70)}, {"i": 15}),
    ("Y[i,p] := exp(X[j,p] - X[i,p])*(2*j <= i)", {"X": (29, 66)}, None),
    (
        "S[i,j] := A[i,e]*B[j,e]; Y[i,p] := tanh(S[i,j])*V[j,p]*(j >= i - 3)",
        {"A": (83, 9), "B": (83, 9), "V": (83, 70)},
        None,
    ),
    (
        "S[i,j] := A[i,e]*B[j,e]; Y[i,p] := exp(S[i,j])*V[j,p]*(j < i)",
        {"A": (81, 16), "B": (90, 16), "V": (90, 20)},
        None,
    ),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("source, shapes, ranges", CASES, ids=[c[0] for c in CASES])
def test_split_tiles_agree_with_the_reference(source, shapes, ranges, dtype, monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(3)
    args = {name: 0.3 * rng.standard_normal(shape) for name, shape in shapes.items()}
    # The scores recomputed inside the program (the cost model alone would store them).
    options = {"fuse": {"S": "inline"}} if ";" in source else {}
    ours = td.kernel(source, backend="c", ranges=ranges, **options)
    truth = td.kernel(source, backend="reference", ranges=ranges, **options)
    cast = [np.asarray(a, dtype) for a in args.values()]
    argnums = tuple(range(len(args)))
    got = [ours(*cast), *jax.grad(lambda *v: (ours(*v) ** 2).sum(), argnums)(*cast)]
    want = [
        truth(*args.values()),
        *jax.grad(lambda *v: (truth(*v) ** 2).sum(), argnums)(*args.values()),
    ]
    tolerance = 2e-6 if dtype == "float32" else 1e-13
    for name, g, w in zip(("value", *args), got, want):
        w = np.asarray(w)
        np.testing.assert_allclose(
            np.asarray(g, np.float64), w, rtol=0, atol=tolerance * np.abs(w).max(), err_msg=name
        )
