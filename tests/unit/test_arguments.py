"""What `td.kernel`, a kernel call and `explain` accept: obvious forms are normalised (NumPy
integers, a single name), everything else is a TensorDSLError naming the argument."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tensordsl as td
from tensordsl.errors import InputError

MATVEC = "Y[i] := X[i,k] * W[k]"
X = np.random.default_rng(0).normal(size=(3, 4))
W = np.random.default_rng(1).normal(size=4)


def kernel(source: str = MATVEC, **options):
    return td.kernel(source, backend="reference", **options)


@pytest.mark.parametrize("source", [None, 5, b"Y[i] := X[i]", ["Y[i] := X[i]"]])
def test_source_must_be_a_string(source) -> None:
    with pytest.raises(td.ParseError, match="the source must be a string"):
        td.kernel(source)


def test_unknown_option_names_the_close_one() -> None:
    with pytest.raises(td.UnknownNameError, match="no option 'reduction'") as error:
        td.kernel(MATVEC, reduction="max")
    assert error.value.hint == "did you mean 'reduce'?"


@pytest.mark.parametrize("extent", [np.int64(2), np.int32(2), np.uint8(2), 2])
def test_ranges_take_any_integer(extent) -> None:
    k = kernel("Y[i] := X[i+k]", ranges={"k": extent})
    assert np.asarray(k(np.arange(5.0))).tolist() == [1.0, 3.0, 5.0, 7.0]


@pytest.mark.parametrize("extent", [True, np.bool_(True), 2.0, -1, None, (0, 2), np.array([2])])
def test_ranges_refuse_what_is_not_an_extent(extent) -> None:
    with pytest.raises(td.RangeError, match=r"ranges\['k'\] is"):
        kernel("Y[i] := X[i+k]", ranges={"k": extent})


@pytest.mark.parametrize("ranges", [[("k", 2)], "k", 3, (("k", 2),)])
def test_ranges_must_be_a_mapping(ranges) -> None:
    with pytest.raises(td.RangeError, match="ranges= must be a dict"):
        kernel("Y[i] := X[i+k]", ranges=ranges)


def test_ranges_are_not_modified() -> None:
    ranges = {"k": np.int64(2)}
    kernel("Y[i] := X[i+k]", ranges=ranges)
    assert type(ranges["k"]) is np.int64


@pytest.mark.parametrize(
    "nograd, frozen",
    [("W2", {"W2"}), (("W2",), {"W2"}), (["X", "W2"], {"X", "W2"}), (None, set()), ((), set())],
)
def test_nograd_takes_one_name_or_several(nograd, frozen) -> None:
    assert kernel("Y[i] := X[i] * W2[i]", nograd=nograd).nograd == frozen


@pytest.mark.parametrize("nograd", [5, [5], ("X", None)])
def test_nograd_refuses_what_is_not_a_name(nograd) -> None:
    with pytest.raises(td.UnknownNameError, match="nograd= must be"):
        kernel("Y[i] := X[i] * W2[i]", nograd=nograd)


@pytest.mark.parametrize("backend", [None, 5, ["c"]])
def test_backend_of_another_type(backend) -> None:
    with pytest.raises(td.UnknownNameError, match="unknown backend"):
        td.kernel(MATVEC, backend=backend)


@pytest.mark.parametrize("reduce", [5, ["max"]])
def test_reduce_of_another_type(reduce) -> None:
    with pytest.raises(td.ReductionError, match="unknown reduction"):
        kernel(reduce=reduce)


def test_loop_order_takes_one_name_or_several() -> None:
    assert kernel("Y[i] := X[i]", loop_order="i").schedule.free_order == ("i",)
    assert kernel(loop_order=["k", "i"]).schedule is not None
    with pytest.raises(td.ScheduleError, match="loop_order= must be"):
        kernel(loop_order=5)
    with pytest.raises(td.ScheduleError, match="unknown: \\['ik'\\]"):
        kernel(loop_order="ik")  # one name, not two letters


@pytest.mark.parametrize("schedule", [5, "tile", object()])
def test_schedule_of_another_type(schedule) -> None:
    with pytest.raises(td.ScheduleError, match="schedule= must be a codegen.c.schedule.Schedule"):
        kernel(schedule=schedule)


def test_a_schedule_named_by_a_string_hints_loop_order() -> None:
    with pytest.raises(td.ScheduleError, match="got 'tile'") as error:
        kernel(schedule="tile")
    assert "hint: loop_order=" in str(error.value)


@pytest.mark.parametrize("backend", ["cuda", "pallas"])
@pytest.mark.parametrize("option", [{"schedule": "tile"}, {"loop_order": ("i", "k")}])
def test_a_back_end_with_schedules_of_its_own_takes_no_loop_schedule(backend, option) -> None:
    """The GPU schedules and Pallas' tile programs are their own: a C schedule would be
    ignored there, so it is refused."""
    with pytest.raises(td.UnsupportedError, match=f"backend='{backend}' chooses its own"):
        td.kernel(MATVEC, backend=backend, **option)


@pytest.mark.parametrize(
    "value", [None, "abc", object(), {"a": 1}, [[1.0, 2.0], [3.0]], np.array([[None]])]
)
def test_inputs_that_are_not_arrays_of_numbers(value) -> None:
    with pytest.raises(InputError, match="input 'X' is not an array of numbers"):
        kernel()(value, W)


def test_complex_inputs_are_unsupported() -> None:
    with pytest.raises(td.UnsupportedError, match="input 'X' is complex"):
        kernel()(X + 1j, W)


def test_inputs_are_not_modified() -> None:
    x, w = X.copy(), W.copy()
    kernel()(x, w)
    np.testing.assert_array_equal(x, X)
    np.testing.assert_array_equal(w, W)


def test_explain_checks_the_shapes_like_a_call() -> None:
    k = kernel()
    assert "Y[i] = sum_k X[i, k]*W[k]" in k.explain(shapes={"X": (3, 4), "W": (np.int64(4),)})
    cases = [
        ({"X": (3, 4), "W": (5,)}, td.RangeError, "index 'k' has extent 4"),
        ({"X": (3,), "W": (4,)}, td.ShapeError, "'X' is a tensor of rank 2"),
        ({"X": (3, 4)}, td.ShapeError, "no array given for 'W'"),
        ({"X": (3, 4), "W": (4,), "Z": (1,)}, td.UnknownNameError, "'Z' is not an input"),
        ({"X": (3, -4), "W": (4,)}, td.ShapeError, "shapes\\['X'\\] is"),
        ({"X": (3, 4.5), "W": (4,)}, td.ShapeError, "shapes\\['X'\\] is"),
        ({"X": "3x4", "W": (4,)}, td.ShapeError, "shapes\\['X'\\] is"),
        ({"X": 3, "W": (4,)}, td.ShapeError, "shapes\\['X'\\] is"),
        ([("X", (3, 4))], td.ShapeError, "shapes= must be a dict"),
    ]
    for shapes, error, message in cases:
        before = copy.deepcopy(shapes)
        with pytest.raises(error, match=message):
            k.explain(shapes=shapes)
        assert shapes == before


def test_source_target_is_checked() -> None:
    with pytest.raises(td.UnknownNameError, match="unknown target 'cu'") as error:
        kernel().source("cu")
    assert error.value.hint == "did you mean 'cuda'?"


@pytest.mark.parametrize("x64", [True, False])
def test_integer_inputs_are_read_as_a_type_that_holds_them(x64: bool) -> None:
    import jax

    from tensordsl.frontend.arguments import computed_dtype

    float_type = "float64" if x64 else "float32"
    expected = {
        "bool": "int32",
        "int8": "int32",
        "uint8": "int32",
        "int16": "int32",
        "uint16": "int32",
        "int32": "int32",
        "uint32": "int64" if x64 else float_type,
        "uint64": float_type,
        "float16": "float16",
        "bfloat16": "bfloat16",
        "float32": "float32",
    }
    with jax.enable_x64(x64):
        assert {d: computed_dtype(d).name for d in expected} == expected
