"""A pair of gradient nests and the gradients of score parameters that its kernel computes
too (`codegen.passes.packing.Pair.extras`: attention's dK and dV, and a relative-bias table's,
ALiBi slopes' or a soft-cap's gradient as per-tile partial sums), as one JAX primitive of
several results, `partials_p`, run by the back end's `Backend.runs_partials`.

Only the forward is fused: the primitive's derivatives (a gradient differentiated again) and
its batching (`vmap` of a backward pass) are those of the separate nests (`nest_p` each), so
they stay exact on every transformation the nests support, at the separate nests' speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.interpreters import ad, batching, mlir

from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest
from codegen.passes.packing import Pair
from tensordsl.backends import table
from tensordsl.binding import private_jax


def call_partials(
    pair: Pair,
    values: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    *,
    backend: str,
    dtype: Any,
    precision: Any,
    nograd: frozenset[str],
    call_nest: Callable[..., jax.Array],
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The pair's packed output and its extras' gradients, by one kernel of `backend`.
    `values`: every array the nests read, by name; `call_nest` runs one nest (`nest_p`) for
    the derivatives and batching."""
    names = tuple(sorted({n for x in (pair.nest, *pair.extras) for n in x.operand_names}))
    known = tuple(sorted((n, tuple(int(d) for d in s)) for n, s in shapes.items()))
    found = partials_p.bind(
        *private_jax.same_varying_axes([values[n] for n in names]),
        pair=pair,
        names=names,
        shapes=known,
        backend=backend,
        dtype=jax.numpy.dtype(dtype).name,
        precision=precision,
        nograd=nograd,
        call_nest=call_nest,
    )
    return found[0], tuple(found[1:])


def _shapes(avals: Sequence[Any], names: tuple, shapes: tuple) -> dict[str, tuple[int, ...]]:
    known = dict(shapes)
    known.update({n: tuple(a.shape) for n, a in zip(names, avals)})
    return known


def _abstract(*avals: Any, pair: Pair, names: tuple, shapes: tuple, dtype: str, **_: Any) -> list:
    known = _shapes(avals, names, shapes)
    out = [output_shape(pair.nest, known), *(known[e.output] for e in pair.extras)]
    return [private_jax.shaped_like(avals[0], tuple(s), jax.numpy.dtype(dtype)) for s in out]


def _fused(*operands: Any, pair: Pair, names: tuple, shapes: tuple, **params: Any) -> list:
    record = table.backend(params["backend"])
    assert record.runs_partials is not None, "only a back end that runs partials pairs extras"
    known = _shapes(operands, names, shapes)
    out, extras = record.runs_partials()(
        pair.nest,
        pair.extras,
        dict(zip(names, operands)),
        known,
        params["dtype"],
        precision=params["precision"],
    )
    return [out, *extras]


def _separate(pair: Pair, names: tuple, shapes: tuple, **params: Any) -> Any:
    """The same results from the separate nests (`nest_p` each): what derivatives and
    batching see."""

    def run(*operands: Any) -> list:
        values = dict(zip(names, operands))
        known = _shapes(operands, names, shapes)
        found = []
        for nest in (pair.nest, *pair.extras):
            found.append(_one(nest, values, known, params))
        return found

    return run


def _one(nest: LoopNest, values: dict, known: dict, params: dict) -> jax.Array:
    operands = [values[n] for n in nest.operand_names]
    return params["call_nest"](
        nest,
        operands,
        backend=params["backend"],
        shapes=known,
        out_dtype=params["dtype"],
        nograd=params["nograd"] & set(nest.operand_names),
        precision=params["precision"],
    )


partials_p = private_jax.multiple_results_primitive("tensordsl_partials", _abstract)
mlir.register_lowering(partials_p, mlir.lower_fun(_fused, multiple_results=True))
private_jax.requires_devices_during_lowering(partials_p)


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> Any:
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(_separate(**params), list(primals), tangents)


ad.primitive_jvps[partials_p] = _jvp


def _batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[Any, list[int]]:
    found = jax.vmap(_separate(**params), in_axes=tuple(dims), out_axes=0)(*args)
    return found, [0] * len(found)


batching.primitive_batchers[partials_p] = _batch
