"""`k.profile(shapes)` and `python -m tensordsl explain ... --time`: every C nest of a forward
and backward pass, timed alone, with its schedule (the structure is checked, not the times)."""

from __future__ import annotations

import re

import pytest

import codegen.c.run.build
import tensordsl as td
from tensordsl.cli import main
from tensordsl.explain.nests import kernel_nests
from tests.backends import NEEDS_C_COMPILER

pytestmark = NEEDS_C_COMPILER
CONV = "Y[i] := X[i+k] * W[k]"
ROW = re.compile(r"^  (\w+) +(\d+\.\d{3}) +(\d+\.\d{3}) +(\d+\.\d)%  (strategy=\S+ .*)$")


def _rows(text: str) -> list[tuple[str, ...]]:
    return [m.groups() for m in map(ROW.match, text.splitlines()) if m]


def test_profile_times_every_nest_in_the_order_value_and_grad_runs_them():
    k = td.kernel(CONV)
    report = k.profile({"X": (40,), "W": (3,)}, reps=3)
    assert [t.name for t in report.timings] == ["forward", "grad_X", "grad_W"]
    assert [t.nest for t in report.timings] == list(kernel_nests(k.nest).values())
    for t in report.timings:
        assert t.reps == 3
        assert 0 < t.best <= t.seconds
        assert t.schedule.startswith("strategy=")
    lines = str(report).splitlines()
    assert lines[0].startswith("timings (c, float32; 3 calls of each nest alone")
    assert lines[1].split() == ["nest", "median", "ms", "best", "ms", "share", "schedule"]
    rows = _rows(str(report))
    assert [r[0] for r in rows] == ["forward", "grad_X", "grad_W"]
    assert sum(float(r[3]) for r in rows) == pytest.approx(100, abs=0.2)
    assert re.match(r"^  total +\d+\.\d{3} +\d+\.\d{3}$", lines[-1])


def test_profile_includes_saved_nests_and_skips_nograd_inputs():
    report = td.kernel("(max) M[i] := X[i,j]").profile({"X": (5, 7)}, dtype="float64", reps=1)
    assert [t.name for t in report.timings] == ["forward", "aux_argument", "grad_X"]
    assert str(report).startswith("timings (c, float64; 1 call of each")
    k = td.kernel("Y[i] := alpha * X[i,j]", nograd=("alpha",))
    report = k.profile({"alpha": (), "X": (4, 6)}, reps=1)
    assert [t.name for t in report.timings] == ["forward", "grad_X"]


def test_profile_times_a_contraction_as_xla_runs_it_and_a_kernel_where_asked(monkeypatch):
    shapes = {"A": (6, 5), "B": (5, 4)}
    heuristic = td.kernel("C[i,j] := A[i,k] * B[k,j]")
    assert all(t.schedule.startswith("strategy=xla") for t in heuristic.profile(shapes).timings)
    ordered = td.kernel("C[i,j] := A[i,k] * B[k,j]", loop_order=("i", "j", "k"))
    built = []
    real_build = codegen.c.run.build.build_c

    def recording_build(nest, **options):
        built.append(nest)
        return real_build(nest, **options)

    monkeypatch.setattr(codegen.c.run.build, "build_c", recording_build)
    timings = ordered.profile(shapes, reps=1).timings
    strategies = [t.schedule.split()[0] for t in timings]
    assert strategies == ["strategy=tile", "strategy=xla", "strategy=xla"]
    assert built == [ordered.nest]


def test_profile_reports_shape_and_dtype_mistakes():
    k = td.kernel(CONV)
    with pytest.raises(td.ShapeError, match="no array given for 'W'"):
        k.profile({"X": (40,)})
    with pytest.raises(td.RangeError):
        k.profile({"X": (2,), "W": (3,)})
    with pytest.raises(td.UnknownNameError, match="unknown dtype 'int8' for profile"):
        k.profile({"X": (40,), "W": (3,)}, dtype="int8")


def test_explain_time_prints_the_timings_after_the_schedules(capsys):
    assert main(["explain", CONV, "--shapes", "X=40", "W=3", "--time", "--reps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.index("schedules (float32)") < out.index("timings (c, float32; 2 calls")
    assert [r[0] for r in _rows(out)] == ["forward", "grad_X", "grad_W"]


def test_explain_time_without_every_shape_is_a_user_error(capsys):
    assert main(["explain", CONV, "--time"]) == 2
    assert "no array given for 'X'" in capsys.readouterr().err


GRAPHSAGE = """
    H[n,d] := X[nbr[n,k], d] / K
    Z[n,o] := X[n,d] * Ws[d,o] + H[n,d] * Wn[d,o]
    Y[n,o] := relu(Z[n,o])
"""
GRAPHSAGE_SHAPES = {"X": (30, 4), "nbr": (30, 3), "K": (), "Ws": (4, 5), "Wn": (4, 5)}


def _jitted_nests(k, shapes, wrt):
    """The nests `jax.jit(jax.value_and_grad(...))` of a call runs, differentiated by `wrt`."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tensordsl.explain.timing import nest_equations

    args = [np.ones(shapes[n], np.int32 if n == "nbr" else np.float32) for n in k.inputs]
    argnums = tuple(k.inputs.index(n) for n in wrt)
    both = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(k(*a)), argnums=argnums))
    return [e.params["nest"] for e in nest_equations(jax.make_jaxpr(both)(*args).jaxpr)]


def test_profile_times_the_nests_jit_runs_without_the_scalars_gradients():
    """A scalar (shape ()) is most often a Python number that jax.grad of a model leaves
    alone: profile leaves its gradient out unless `wrt` names it, and times exactly the
    nests of the jitted value_and_grad."""
    k = td.kernel("Y[i] := alpha * X[i,j]")
    shapes = {"alpha": (), "X": (4, 6)}
    assert [t.name for t in k.profile(shapes, reps=1).timings] == ["forward", "grad_X"]
    named = k.profile(shapes, reps=1, wrt=("alpha", "X")).timings
    assert [t.name for t in named] == ["forward", "grad_alpha", "grad_X"]
    assert [t.name for t in k.profile(shapes, reps=1, wrt="alpha").timings] == [
        "forward",
        "grad_alpha",
    ]
    program = td.program(GRAPHSAGE)
    timed = [t.nest for t in program.profile(GRAPHSAGE_SHAPES, reps=1).timings]
    assert timed == _jitted_nests(program, GRAPHSAGE_SHAPES, ("X", "Ws", "Wn"))


def test_profile_of_a_scalar_gradient_through_xla_and_a_gather():
    """GraphSAGE's `dK` is an XLA contraction with a scalar prologue (`1/K^2`): it raised a
    ValueError (the scalar's random value made an array of one element). A parameter of one
    element is now summed from per-row partial sums (`dK_rows_`, `codegen/passes/partials.py`)."""
    program = td.program(GRAPHSAGE)
    report = program.profile(GRAPHSAGE_SHAPES, reps=1, wrt=("X", "K", "Ws", "Wn"))
    names = [t.name for t in report.timings]
    assert {"dK", "dK_rows_"} & set(names) and "dX" in names, names
    assert all(t.best > 0 for t in report.timings)


def test_profile_wrt_must_name_inputs():
    k = td.kernel(CONV)
    with pytest.raises(td.UnknownNameError, match="unknown input 'Q' in profile's wrt="):
        k.profile({"X": (40,), "W": (3,)}, wrt=("X", "Q"))
    with pytest.raises(td.UnknownNameError, match="unknown input 'Q' in profile's wrt="):
        td.program(GRAPHSAGE).profile(GRAPHSAGE_SHAPES, wrt="Q")


def test_profile_jaxpr_times_the_tangent_nests_of_an_hvp():
    """Forward over reverse (`jax.jvp` of `jax.grad`): each gradient nest's tangent term is
    timed as the tangent nest its lowering runs, after the nests of the first order."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from codegen.passes import jvp
    from tensordsl.explain.timing import profile_jaxpr

    k = td.kernel("Y[i] := exp(X[i,j]) * W[j]", backend="c")
    X, W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.ones(4, np.float32)

    def hvp(X, W):
        grad = jax.grad(lambda X, W: jnp.sum(jnp.sin(k(X, W))), (0, 1))
        return jax.jvp(grad, (X, W), (X, W))[1]

    report = profile_jaxpr(jax.make_jaxpr(hvp)(X, W).jaxpr, reps=1)
    names = [t.name for t in report.timings]
    assert names[:2] == ["Y", "tY"], names
    assert {"tdX", "tdW"} <= set(names), names
    # Only the tangents are read: the first-order gradients do not run once compiled.
    assert not {"dX", "dW"} & set(names), names
    (tangent,) = [t.nest for t in report.timings if t.name == "tY"]
    assert tangent == jvp.tangent(k.nest, ("X", "W")).nest
