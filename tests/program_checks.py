"""Checks of the program corpus that every back end's tests share: values and gradients.

Values are compared with each case's float64 numpy reference; gradients (a `jax.vjp` with a
random cotangent per output) with central differences of that reference along a random
direction per input, so no check trusts tensordsl's own gradient nests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td
from tests.corpus import make_inputs
from tests.programs import ProgramCase, directional_derivative

TOLERANCE = {"float64": dict(rtol=1e-10, atol=1e-11), "float32": dict(rtol=2e-4, atol=2e-5)}


def program_kernel(case: ProgramCase, backend: str) -> td.ProgramKernel:
    options = {} if case.outputs is None else {"outputs": case.outputs}
    return td.kernel(case.source, backend=backend, **options)


def as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def float_names(inputs: dict) -> list[str]:
    return [n for n, v in inputs.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]


def check_values(case: ProgramCase, backend: str, dtype: str = "float64") -> None:
    inputs = make_inputs(case)
    cast = {
        n: np.asarray(v, dtype) if n in float_names(inputs) and np.ndim(v) else v
        for n, v in inputs.items()
    }
    got = as_tuple(program_kernel(case, backend)(**cast))
    expected = case.expected(**inputs)
    assert len(got) == len(expected)
    for n, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == np.shape(e), (n, g.shape, np.shape(e))
        assert g.dtype == np.dtype(dtype), (n, g.dtype)
        np.testing.assert_allclose(np.asarray(g), e, **TOLERANCE[dtype], err_msg=f"output {n}")


def check_gradients(case: ProgramCase, backend: str, *, transform=jax.jit) -> None:
    """Every float input's gradient against central differences (float64)."""
    inputs = make_inputs(case)
    names = float_names(inputs)
    k = program_kernel(case, backend)

    def outputs(*values):
        return as_tuple(k(**{**inputs, **dict(zip(names, values))}))

    primals = [jnp.asarray(inputs[n], jnp.float64) for n in names]
    result, vjp = jax.vjp(transform(outputs), *primals)
    rng = np.random.default_rng(7)
    cotangents = tuple(rng.normal(size=np.shape(r)) for r in result)
    for name, gradient in zip(names, vjp(tuple(jnp.asarray(c) for c in cotangents))):
        direction = rng.normal(size=np.shape(inputs[name]))
        want = directional_derivative(case, inputs, cotangents, name, direction)
        got = float(np.sum(np.asarray(gradient) * direction))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8, err_msg=f"gradient of {name}")
