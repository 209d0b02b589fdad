"""What a user passes to `td.kernel`, a kernel call and `explain`, checked and normalised.

Obvious forms are accepted and put in one form (a NumPy integer is an `int`, a single name is
a tuple of one name); anything else raises the `TensorDSLError` of the argument's subject.
Nothing the user passed is modified.

>>> names("W2", option="nograd")
('W2',)
>>> extents({"k": np.int64(3)}, "Y[i] := X[i+k]")
{'k': 3}
>>> shape_table({"X": [np.int64(2), 3]}, "Y[i] := X[i,j]")
{'X': (2, 3)}
>>> computed_dtype(np.uint8), computed_dtype(np.float16)
(dtype('int32'), dtype('float16'))
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tensordsl.errors import (
    ArgumentCountError,
    InputError,
    ParseError,
    RangeError,
    ScheduleError,
    ShapeError,
    TensorDSLError,
    UnknownNameError,
    UnsupportedError,
    close_match,
)

#: The error class of each option that takes names.
_NAME_ERRORS: dict[str, type[TensorDSLError]] = {
    "nograd": UnknownNameError,
    "loop_order": ScheduleError,
}


def source_text(source: Any) -> str:
    """The statement itself; anything but a string is refused."""
    if not isinstance(source, str):
        raise ParseError(
            f"the source must be a string, got {type(source).__name__}",
            expected="one statement, as in td.kernel('Y[i] := X[i,k] * W[k]')",
        )
    return source


def _is_integer(value: Any) -> bool:
    """Python and NumPy integers; bools are not extents."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def names(value: Any, *, option: str) -> tuple[str, ...]:
    """One name or an iterable of names, as a tuple; None is no names."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    items = tuple(value) if isinstance(value, Iterable) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raise _NAME_ERRORS[option](
            f"{option}= must be a name or a tuple of names, got {value!r}",
            expected=f"as in {option}='W' or {option}=('W', 'b')",
        )
    return items


def backend(value: str, backends: tuple[str, ...]) -> str:
    """`value` when it names one of `backends`."""
    if value not in backends:
        raise UnknownNameError(
            f"unknown backend '{value}'",
            expected="one of " + ", ".join(backends),
            hint=close_match(value, backends),
        )
    return value


#: The precisions `precision=` names, as `jnp.einsum(precision=...)` takes them.
PRECISIONS = ("default", "high", "highest")


def precision(value: Any) -> Any:
    """`value` as `jax.lax.Precision`, or None (jnp's default: the `jax_default_matmul_precision`
    in effect when the kernel is traced).

    >>> precision("highest")
    Precision.HIGHEST
    >>> precision(None) is None
    True
    """
    import jax

    if value is None or isinstance(value, jax.lax.Precision):
        return value
    if isinstance(value, str):
        try:
            return jax.lax.Precision(value.lower())
        except ValueError:
            pass
    raise UnknownNameError(
        f"unknown precision {_describe(value)}",
        expected="None, " + ", ".join(repr(p) for p in PRECISIONS) + " or a jax.lax.Precision",
        hint=close_match(value.lower() if isinstance(value, str) else value, PRECISIONS),
    )


def nograd(value: Any, inputs: tuple[str, ...], source: str, *, of: str) -> frozenset[str]:
    """The `nograd=` option (one name or several) as a set of inputs of the kernel or program
    (`of`)."""
    found = names(value, option="nograd")
    for name in found:
        if name not in inputs:
            raise UnknownNameError(
                f"nograd names '{name}', which is not an input of the {of}",
                source,
                expected="one of " + ", ".join(inputs),
                hint=close_match(name, inputs),
            )
    return frozenset(found)


def extents(ranges: Any, source: str) -> dict[str, Any] | None:
    """`ranges=` as a new dict, with NumPy integers as ints (the lowering checks the rest)."""
    if ranges is None:
        return None
    if not isinstance(ranges, Mapping):
        raise RangeError(
            f"ranges= must be a dict from index name to extent, got {type(ranges).__name__}",
            source,
            expected="as in ranges={'k': 3, 'j': range(-1, 2)}",
            hint="dict(...) of the pairs" if isinstance(ranges, list | tuple) else None,
        )
    return {name: int(v) if _is_integer(v) else v for name, v in ranges.items()}


def _shape(name: Any, value: Any, source: str) -> tuple[int, ...]:
    dims = tuple(value) if isinstance(value, list | tuple) else None
    if dims is None or not all(_is_integer(d) and d >= 0 for d in dims):
        raise ShapeError(
            f"shapes[{name!r}] is {value!r}",
            source,
            expected="a tuple of extents (ints >= 0), as in (3, 4), or () for a scalar",
        )
    return tuple(int(d) for d in dims)


def shape_table(shapes: Any, source: str) -> dict[str, tuple[int, ...]]:
    """`shapes=` as a new dict of int tuples."""
    if not isinstance(shapes, Mapping):
        raise ShapeError(
            f"shapes= must be a dict from input name to shape, got {type(shapes).__name__}",
            source,
            expected="as in shapes={'X': (3, 4), 'W': (4,)}",
        )
    return {name: _shape(name, value, source) for name, value in shapes.items()}


def unknown_names(given: Iterable[Any], inputs: tuple[str, ...], source: str) -> None:
    """Refuse a name that is not an input of the kernel."""
    unknown = [name for name in given if name not in inputs]
    if unknown:
        raise UnknownNameError(
            f"'{unknown[0]}' is not an input of the kernel",
            source,
            expected="inputs " + (", ".join(inputs) or "none"),
            hint=close_match(unknown[0], inputs),
        )


def bind(
    names: tuple[str, ...], source: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> list[Any]:
    """The inputs in `names` order, given all by position or all by name."""
    listing = "inputs " + ", ".join(names)
    if args and kwargs:
        raise ArgumentCountError(
            "pass the inputs either all by position or all by name", source, expected=listing
        )
    if not kwargs:
        if len(args) != len(names):
            raise ArgumentCountError(
                f"the kernel takes {len(names)} input{'s' * (len(names) != 1)}, got {len(args)}",
                source,
                expected=listing,
            )
        return list(args)
    unknown_names(kwargs, names, source)
    for name in names:
        if name not in kwargs:
            raise ArgumentCountError(f"missing input '{name}'", source, expected=listing)
    return [kwargs[name] for name in names]


def input_array(name: str, value: Any, source: str) -> Any:
    """An input as a JAX array (JAX arrays and tracers pass through), real numbers only."""
    import jax
    import jax.numpy as jnp

    order = getattr(getattr(value, "dtype", None), "byteorder", "=")
    if isinstance(value, np.ndarray) and order not in ("=", "|") and order != _NATIVE:
        raise InputError(
            f"input '{name}' has non-native byte order ({value.dtype.str}): kernels read "
            "numbers in this machine's byte order",
            source,
            expected=f"an array in native byte order ({value.dtype.newbyteorder('=').str})",
            hint=f"pass {name}.astype({value.dtype.newbyteorder('=').name!r})",
        )
    if not isinstance(value, jax.Array):
        _check_kept_integers(name, value, source)
        try:
            value = jnp.asarray(value)
        except (TypeError, ValueError):
            raise InputError(
                f"input '{name}' is not an array of numbers: {_describe(value)}",
                source,
                expected="a NumPy or JAX array, a Python number or a nested list of numbers",
            ) from None
    if jnp.issubdtype(value.dtype, jnp.complexfloating):
        raise UnsupportedError(
            f"input '{name}' is complex ({value.dtype}); kernels compute with real numbers",
            source,
            expected="a real array",
            hint="run the real and imaginary parts through separate kernels",
        )
    if np.dtype(value.dtype).name not in INPUT_DTYPES:
        raise UnsupportedError(
            f"input '{name}' has dtype {np.dtype(value.dtype).name}, which kernels do not read",
            source,
            expected=f"one of {', '.join(INPUT_DTYPES)}",
            hint=f"pass {name}.astype('float32')",
        )
    return value


def _check_kept_integers(name: str, value: Any, source: str) -> None:
    """Refuses `value` where it holds integers that JAX would wrap when it converts them to
    its 32-bit type (without `jax_enable_x64`): 2^32 + 1 read as 1 is a wrong row, silently."""
    import jax

    dtype = getattr(value, "dtype", None)
    if dtype is None or not np.issubdtype(dtype, np.integer):
        return
    kept = np.dtype(jax.dtypes.canonicalize_dtype(dtype))
    if kept == dtype or np.size(value) == 0:
        return
    low, high = int(np.min(value)), int(np.max(value))
    limits = np.iinfo(kept)
    for bad in (v for v in (high, low) if not limits.min <= v <= limits.max):
        raise InputError(
            f"input '{name}' holds {bad}, beyond {kept.name}, the integers JAX keeps without "
            "64-bit mode",
            source,
            expected=f"values inside [{limits.min}, {limits.max}] for a {dtype.name} array",
            hint="enable 64-bit integers with jax.config.update('jax_enable_x64', True)",
        )


_NATIVE = "<" if sys.byteorder == "little" else ">"
#: The dtypes an input may have: floats are computed in, integers and bool converted
#: (`computed_dtype`); float8, int4 and the like are refused by name.
INPUT_DTYPES = (
    "float16", "bfloat16", "float32", "float64", "bool",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
)  # fmt: skip


def computed_dtype(dtype: Any) -> np.dtype:
    """The dtype the back ends read an input of `dtype` in (they all read the same).

    Floats, int32 and int64 stay. bool and other integers become the smallest signed integer
    type holding all their values, int32 or int64 (with `jax_enable_x64`), so that they still
    compare exactly with indices; where there is none (uint64, or uint32 without x64) they
    become the default float type, as jnp promotes them with a signed integer.
    """
    import jax
    import jax.numpy as jnp

    dtype = np.dtype(dtype)
    if dtype != np.bool_ and not np.issubdtype(dtype, np.integer):
        return dtype
    for signed in (np.dtype(np.int32), np.dtype(np.int64)):
        available = jax.dtypes.canonicalize_dtype(signed) == signed
        if available and np.can_cast(dtype, signed, casting="safe"):
            return signed
    return np.dtype(jnp.result_type(float))


def computed_input(name: str, value: Any, source: str) -> Any:
    """`input_array`, in the dtype the back ends read it in (`computed_dtype`)."""
    array = input_array(name, value, source)
    dtype = computed_dtype(array.dtype)
    return array if dtype == array.dtype else array.astype(dtype)


def computed_inputs(names: Sequence[str], values: Sequence[Any], source: str) -> list[Any]:
    """`computed_input` of each input, with `narrowed_weak_floats`."""
    return narrowed_weak_floats([computed_input(n, v, source) for n, v in zip(names, values)])


def narrowed_weak_floats(values: Sequence[Any]) -> list[Any]:
    """The inputs (JAX arrays or tracers), with every weakly typed float (a Python float, or
    `jnp.asarray(0.5)`) in the float type of the other inputs, as JAX promotes `x * 0.5`.

    Under `jax_enable_x64` a Python float is a weakly typed float64: passed on as it is, it
    made the kernels of float32 inputs compute in double, 3 to 6 times slower (issue 38).

    >>> import jax.numpy as jnp
    >>> [str(v.dtype) for v in narrowed_weak_floats([jnp.ones(2, "float32"), jnp.asarray(0.5)])]
    ['float32', 'float32']
    """
    import jax
    import jax.numpy as jnp

    floats = [v for v in values if jnp.issubdtype(v.dtype, jnp.floating)]
    if not floats:
        return list(values)
    target = jnp.result_type(*floats)
    narrow = [jnp.issubdtype(v.dtype, jnp.floating) and jax.typeof(v).weak_type for v in values]
    return [v.astype(target) if n and v.dtype != target else v for v, n in zip(values, narrow)]


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
