"""The language's logical operators (`&`, `|`, `and`, `or`, `not`, `~`), `//` and `%`, the
scalar functions of issue 37 and 38 (`acos`, ..., `clamp` of values, `atan(y, x)`) and
ranges inferred from every read, against float64 numpy on random inputs, forwards and
gradients, on the reference, C and CUDA back ends (the CUDA emulator where there is no GPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.ir.functions import FUNCTIONS
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)
from tests.cpu.math_sweep import REFERENCES

pytestmark = pytest.mark.usefixtures("generated_kernels")

T = 7
I, J = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")

#: condition as written -> its value over (i, j) and the scores S, in numpy
CONDITIONS = {
    "(j <= i) & (j > i - 3)": lambda S: (J <= I) & (J > I - 3),
    "(j <= i) and not (j < i - 3)": lambda S: (J <= I) & ~(J < I - 3),
    "j <= i & j > i - 3": lambda S: (J <= I) & (J > I - 3),
    "(j < 2) | (j > i)": lambda S: (J < 2) | (J > I),
    "j == 0 or (i - j) % 2 == 0": lambda S: (J == 0) | ((I - J) % 2 == 0),
    "~(j > i)": lambda S: ~(J > I),
    "not j > i": lambda S: ~(J > I),
    "i // 3 == j // 3": lambda S: I // 3 == J // 3,
    "(S[i,j] > 0) & (j <= i)": lambda S: (S > 0) & (J <= I),
    "(S[i,j] > 0) | not (j != i)": lambda S: (S > 0) | (J == I),
    "S[i,j] and j <= i": lambda S: (S != 0) & (J <= I),
    "(j <= i) * ~(S[i,j] > 0)": lambda S: (J <= I) & ~(S > 0),  # `~` as a factor, as in Python
}


def _scores(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(T, T))


def _check(kernel, truth, *inputs) -> None:
    """Forward and gradient of every input against `truth` (jnp, float64; jitted: eagerly
    each of its operations is compiled alone)."""
    expected = np.asarray(jax.jit(truth)(*inputs))
    np.testing.assert_allclose(np.asarray(kernel(*inputs)), expected, rtol=1e-12, atol=1e-14)
    cotangent = np.random.default_rng(9).normal(size=np.shape(expected))
    argnums = tuple(range(len(inputs)))
    got = jax.grad(lambda *a: jnp.vdot(kernel(*a), cotangent), argnums)(*inputs)
    want = jax.jit(jax.grad(lambda *a: jnp.vdot(truth(*a), cotangent), argnums))(*inputs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_conditions_as_values_and_in_where(backend: str, condition: str) -> None:
    S = _scores()
    mask = CONDITIONS[condition](S)
    k = td.kernel(
        f"Y[i] := S[i,j] * ({condition}) + where({condition}, S[i,j]^2, -S[i,j])", backend=backend
    )
    _check(k, lambda S: jnp.sum(S * mask + jnp.where(mask, S**2, -S), 1), S)


@pytest.mark.parametrize(
    ("source", "truth"),
    [
        ("Y[i] := X[i] * ((i - 5) % 3)", lambda X: X * ((np.arange(T) - 5) % 3)),
        ("Y[i] := X[i] * ((5 - i) // 2)", lambda X: X * ((5 - np.arange(T)) // 2)),
        ("Y[i] := X[i] * (i % -3)", lambda X: X * (np.arange(T) % -3)),
        ("Y[i] := X[i] % 0.7", lambda X: jnp.mod(X, 0.7)),
        ("Y[i] := X[i] // 0.3 + X[i]", lambda X: jnp.floor_divide(X, 0.3) + X),
        ("Y[i] := 3 % X[i]", lambda X: jnp.mod(3.0, X)),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_floor_division_and_remainder(backend: str, source: str, truth) -> None:
    X = np.random.default_rng(1).uniform(-3, 3, T)
    _check(td.kernel(source, backend=backend), truth, X)


#: The new functions' float64 numpy references: the math sweep's, and the step functions.
NEW_FUNCTIONS = (
    *("exp2", "log2", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh"),
    *("asinh", "acosh", "atanh", "erfc"),
)
NUMPY = {name: REFERENCES[name] for name in NEW_FUNCTIONS} | {
    "square": np.square,
    "floor": np.floor,
    "ceil": np.ceil,
    "sign": np.sign,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(NUMPY))
def test_new_functions_and_their_gradients(backend: str, name: str) -> None:
    low, high = FUNCTIONS[name].domain
    X = np.random.default_rng(2).uniform(low, high, 11)
    k = td.kernel(f"Y[i] := {name}(X[i]) * W[i]", backend=backend)
    W = np.random.default_rng(3).normal(size=11)
    np.testing.assert_allclose(np.asarray(k(X, W)), NUMPY[name](X) * W, rtol=1e-12)
    module, _, attribute = FUNCTIONS[name].reference.rpartition(".")
    function = getattr(__import__(module, fromlist=[attribute]), attribute)
    _check(k, lambda X, W: function(X) * W, X, W)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clamp_of_values_and_two_argument_atan(backend: str) -> None:
    rng = np.random.default_rng(4)
    X, lo, hi = rng.normal(size=9), rng.uniform(-1, -0.2, 9), rng.uniform(0.2, 1, 9)
    clamp = td.kernel("Y[i] := clamp(X[i], lo[i], hi[i])", backend=backend)
    _check(clamp, lambda X, lo, hi: jnp.clip(X, lo, hi), X, lo, hi)
    fixed = td.kernel("Y[i] := clamp(2 * X[i], -0.5, 0.5) + clamp(i, 2, 4)", backend=backend)
    np.testing.assert_allclose(
        np.asarray(fixed(X)), np.clip(2 * X, -0.5, 0.5) + np.clip(np.arange(9), 2, 4), rtol=1e-12
    )
    atan = td.kernel("Y[i] := atan(X[i], hi[i]) + atan(X[i])", backend=backend)
    _check(atan, lambda X, hi: jnp.arctan2(X, hi) + jnp.arctan(X), X, hi)


def test_a_conjunction_of_index_comparisons_bounds_the_loops() -> None:
    for condition in ("(j <= i) & (j > i - 8)", "j <= i and not j <= i - 8"):
        k = td.kernel(f"Y[i] := where({condition}, X[i,j], 0)", backend="c")
        text = k.explain({"X": (16, 16)})
        assert "j in [max(0, i - 7), min(16, i + 1))" in text, text
        assert "where" not in text.split("forward")[1].split("gradient")[0], text
    mixed = td.kernel("Y[i] := where((j <= i) & (X[i,j] > 0), X[i,j], 0)", backend="c")
    assert "j in [0, min(16, i + 1))" in mixed.explain({"X": (16, 16)})


@pytest.mark.parametrize("backend", BACKENDS)
def test_ranges_inferred_from_every_read(backend: str) -> None:
    rng = np.random.default_rng(5)
    X, W = rng.normal(size=9), rng.normal(size=4)
    k = td.kernel("Y[i] := X[i+k] * W[k+1]", backend=backend)  # k over [-1, 3), i over [1, 7)
    want = np.array([sum(X[i + kk] * W[kk + 1] for kk in range(-1, 3)) for i in range(1, 7)])
    np.testing.assert_allclose(np.asarray(k(X, W))[-6:], want, rtol=1e-12)
    D = rng.normal(size=(5, 6))
    arg = td.kernel("(argmin) A[n] := D[n, mod(c)]", backend=backend)
    np.testing.assert_array_equal(np.asarray(arg(D)), np.argmin(D, 1))


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        ("Y[i] := X[i // 2]", td.IndexExpressionError, r"'i // 2' is not affine: '//' rounds"),
        ("Y[i] := X[(i - 1) % 4]", td.IndexExpressionError, r"'%' rounds"),
        ("Y[i] := X[i & 1]", td.IndexExpressionError, "it contains a condition"),
        ("Y[i] := X[i] * (i // 0)", td.ExpressionError, "is not a nonzero constant"),
        ("Y[i,j] := X[i] * (i % j)", td.ExpressionError, r"divisor of 'i % j'"),
        ("Y[i] := clamp(X[i])", td.IndexExpressionError, "with 1 argument is an index form"),
        ("Y[i] := acos(X[i], 1, 2)", td.ShapeError, "'acos' takes 1 argument"),
        ("Y[i] := X[i] & ", td.ParseError, "unexpected end of input"),
        ("Y[i] := X[i] < 1 < 2", td.ParseError, "comparisons do not chain"),
        # bitwise in Python and FlexAttention: refused, never read as `i != 0`
        ("Y[i] := X[i] * ((i & 1) == 0)", td.UnsupportedError, r"'&' of the integer 'i' would"),
        ("Y[i,j] := X[i] * ((i - j) % 2 | (j < 1))", td.UnsupportedError, r"'\|' of the integer"),
        ("Y[i] := X[i] * ~i", td.UnsupportedError, r"'~' of the integer 'i' would be bitwise"),
    ],
)
def test_errors(source: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        td.kernel(source, ranges={"j": 3} if "j" in source else None)


def test_a_bitwise_reading_is_refused_in_the_users_format() -> None:
    with pytest.raises(td.UnsupportedError) as error:
        td.nn.attention(*np.ones((3, 4, 2, 8)), mask_mod="(q_idx & 1) == 0")
    assert isinstance(error.value, NotImplementedError)
    lines = str(error.value).splitlines()
    assert lines[0].endswith(
        "'&' of the integer 'i' would be bitwise in Python; here '&', '|' and '~' join conditions"
    )
    assert lines[-1].startswith("hint: the lowest bit of i is 'i % 2 == 1'")


@pytest.mark.parametrize("backend", BACKENDS)
def test_words_and_conditions_of_0_and_1_keep_reading_values(backend: str) -> None:
    """`and`/`or`/`not` are logical in Python too; `& 1` of a condition is the condition."""
    X = np.random.default_rng(8).normal(size=(T, T))
    k = td.kernel("Y[i] := X[i,j] * ((i and j <= 4) + ((j <= i) & 1) + (not i))", backend=backend)
    truth = ((I != 0) & (J <= 4)).astype(int) + (J <= I) + (I == 0)
    _check(k, lambda X: jnp.sum(X * truth, 1), X)


def _attention_truth(q, k, v):
    """jnp float64: sliding window of 3 (causal), plus 0.1 on odd offsets."""
    n = q.shape[1]
    i, j = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
    s = jnp.einsum("bihd,bjhd->bhij", q, k) / 2.0 + 0.1 * ((i - j) % 2)
    s = jnp.where((i >= j) & (i - j < 3), s, -jnp.inf)
    return jnp.einsum("bhij,bjhe->bihe", jax.nn.softmax(s, -1), v)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_takes_flex_attention_names_and_operators(backend: str) -> None:
    rng = np.random.default_rng(6)
    q, k, v = (rng.normal(size=(1, 6, 2, 4)) for _ in range(3))

    def ours(q, k, v):
        return td.nn.attention(
            q,
            k,
            v,
            score_mod="score + 0.1 * ((q_idx - kv_idx) % 2)",
            mask_mod="(q_idx >= kv_idx) & (q_idx - kv_idx < 3)",
            backend=backend,
        )

    _check(ours, _attention_truth, q, k, v)


def test_attention_names_hint_at_flex_attention_spellings() -> None:
    q = np.ones((1, 2, 1, 4))
    with pytest.raises(td.UnknownNameError, match="did you mean 'kv_idx'"):
        td.nn.attention(q, q, q, mask_mod="q_idx >= kv_idex", backend="reference")
    with pytest.raises(td.UnknownNameError, match="mask_mod reads the score 'S'"):
        td.nn.attention(q, q, q, mask_mod="score > 0", backend="reference")
