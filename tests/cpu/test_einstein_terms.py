"""Einstein's rule term by term (issue 36 item 1): after products are distributed over sums,
each additive term of a sum is summed over exactly the reduced indices it reads (one that reads
none is added once), whatever the order of the terms, with NaN and infinities kept; on the
reference, C and CUDA back ends (the CUDA emulator where there is no GPU), forward and
gradient, alone and in programs fused or not. Every check is against float64 numpy/jnp."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)
from tests.sampling import product

pytestmark = pytest.mark.usefixtures("generated_kernels")

SHAPES = {
    "X": (3, 5),
    "W": (5, 4),
    "A": (5, 2),
    "B": (2, 4),
    "c": (3,),
    "D": (3, 5),
    "V": (5, 2),
    "u": (2,),
    "e": (3,),
}

#: source -> (operands in order, the float64 jnp computation term by term)
CASES = {
    # LoRA: X W is summed over i only, not over r (it was R*(X W) + X A B)
    "Y[b,o] := X[b,i] * (W[i,o] + A[i,r] * B[r,o])": (
        "XWAB",
        lambda X, W, A, B: X @ W + X @ A @ B,
    ),
    # the order of the terms does not matter (it was 4*c for the first)
    "Y[i] := X[i,j] + c[i] - X[i,j]": ("Xc", lambda X, c: X.sum(1) + c - X.sum(1)),
    "Y[i] := X[i,j] - X[i,j] + c[i]": ("Xc", lambda X, c: X.sum(1) - X.sum(1) + c),
    "Y[i] := c[i] + X[i,j] - X[i,j]": ("cX", lambda c, X: c + X.sum(1) - X.sum(1)),
    # three terms over three different sets of reduced indices: {j, r}, {j} and none
    "Y[i] := X[i,j] * V[j,r] * u[r] + D[i,j] - e[i]": (
        "XVuDe",
        lambda X, V, u, D, e: X @ V @ u + D.sum(1) - e,
    ),
    "Y[i] := 2 * (X[i,j] * (D[i,j] + V[j,r] * u[r]) - c[i])": (
        "XDVuc",
        lambda X, D, V, u, c: 2 * ((X * D).sum(1) + X @ V @ u - c),
    ),
    "Y[i] := (X[i,j] + c[i]) / 4": ("Xc", lambda X, c: X.sum(1) / 4 + c / 4),
    # a function's argument is not a top-level sum: summed as one term
    "Y[i] := exp(X[i,j] + c[i])": ("Xc", lambda X, c: jnp.exp(X + c[:, None]).sum(1)),
    # a mean divides each term by the number of values it sums: the mean of the body
    # broadcast over every reduced index
    "(mean) Y[b,o] := X[b,i] * (W[i,o] + A[i,r] * B[r,o])": (
        "XWAB",
        lambda X, W, A, B: (X @ W) / 5 + (X @ A @ B) / 10,
    ),
    # other reductions reduce the whole body over every reduced index
    "(max) Y[i] := X[i,j] + c[i]": ("Xc", lambda X, c: (X + c[:, None]).max(1)),
    "(prod) Y[i] := X[i,j] + c[i]": ("Xc", lambda X, c: (X + c[:, None]).prod(1)),
}


def _inputs(names: str, seed: int = 36) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=SHAPES[n]) + 0.5 for n in names]


def _check(got, want, rtol: float = 1e-10) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(want) * np.sign(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", list(CASES))
def test_each_term_is_summed_over_the_indices_it_reads(backend, source):
    names, oracle = CASES[source]
    values = _inputs(names)
    k = td.kernel(source, backend=backend)
    _check(k(*values), oracle(*values))


GRADIENT_CASES = [s for s in CASES if not s.startswith(("(max)", "(prod)"))]


@pytest.mark.parametrize(("source", "backend"), product(GRADIENT_CASES, BACKENDS, every=3, cover=1))
def test_gradients_follow_the_rule(backend, source):
    names, oracle = CASES[source]
    values = _inputs(names)
    k = td.kernel(source, backend=backend)
    cotangent = np.random.default_rng(7).normal(size=np.shape(oracle(*values)))
    argnums = tuple(range(len(values)))
    got = jax.grad(lambda *v: jnp.sum(k(*v) * cotangent), argnums)(*values)
    want = jax.grad(lambda *v: jnp.sum(oracle(*v) * cotangent), argnums)(*values)
    for name, g, w in zip(names, got, want, strict=True):
        assert g.shape == w.shape, name
        _check(g, w, 1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cancelling_pair_stays_nan_at_an_infinity(backend):
    X, c = _inputs("Xc")
    X[1, 2] = np.inf
    for source in ("Y[i] := X[i,j] + c[i] - X[i,j]", "Y[i] := X[i,j] - X[i,j] + c[i]"):
        got = np.asarray(td.kernel(source, backend=backend)(X, c))
        assert np.isnan(got[1]), source
        np.testing.assert_allclose(got[[0, 2]], c[[0, 2]], rtol=1e-12, err_msg=source)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fuse", [True, False])
def test_programs_fused_or_not_follow_the_rule(backend, fuse):
    X, W, A, B, c = _inputs("XWABc")
    source = "H[b,o] := X[b,i] * (W[i,o] + A[i,r] * B[r,o]); Y[b] := H[b,o] * H[b,o] + c[b]"
    k = td.program(source, backend=backend, fuse=None if fuse else False)
    H = X @ W + X @ A @ B
    _check(k(X, W, A, B, c), (H * H).sum(1) + c)
    cotangent = np.random.default_rng(8).normal(size=3)

    def want(X, W, A, B, c):
        H = X @ W + X @ A @ B
        return jnp.sum(((H * H).sum(1) + c) * cotangent)

    got = jax.grad(lambda *v: jnp.sum(k(*v) * cotangent), tuple(range(5)))(X, W, A, B, c)
    for g, w in zip(got, jax.grad(want, tuple(range(5)))(X, W, A, B, c), strict=True):
        _check(g, w, 1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inlined_statement_keeps_its_terms(backend):
    # T is inlined into Y (read once per element): its terms keep their own sums there.
    X, c, D = _inputs("XcD")
    source = "T[i] := X[i,j] + c[i] - X[i,j]; Y[i,k] := T[i] * D[i,k]"
    k = td.program(source, backend=backend)
    _check(k(X, c, D), (X.sum(1) + c - X.sum(1))[:, None] * D)


def test_explain_shows_each_terms_sum():
    text = td.kernel("Y[b,o] := X[b,i] * (W[i,o] + A[i,r] * B[r,o])").explain()
    assert "(sum_i X[b, i]*W[i, o])" in text, text
    assert "sum_r" in text and "sum_i" in text, text


def test_a_product_of_sums_sharing_an_index_is_refused():
    # summed term by term, (X + 1)*(D + 1) adds 1*1 once; summed as a whole, once per j
    with pytest.raises(td.TensorDSLError, match="ambiguous") as err:
        td.kernel("Y[i] := (X[i,j] + 1) * (D[i,j] + 1)")
    assert "size(j)" in str(err.value)
    # the square of a sum is a power: summed as one term
    X, c = _inputs("Xc")
    got = td.kernel("Y[i] := (X[i,j] - c[i]) * (X[i,j] - c[i])", backend="reference")(X, c)
    _check(got, ((X - c[:, None]) ** 2).sum(1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fused_gradient_reads_an_input_inside_and_outside_a_nested_sum(backend):
    # Found by tests/cpu/test_term_fuzz.py: inlined, H's terms become
    # `2*sum_r(X + s*T*t) + 2*s*c`; the gradient of s took only the nested sum's part.
    X, T = _inputs("XD")
    s, t, c = 0.7, 1.3, 0.4
    k = td.program("H[i] := X[i,r] + s*T[i,r]*t + s*c; Y[i] := 2 * H[i]", backend=backend)
    ds = jax.grad(lambda s: jnp.sum(k(X, s, T, t, c)), 0)(s)
    _check(ds, 2 * (T.sum() * t + X.shape[0] * c), 1e-9)
