"""Where a `where` is computed (`codegen.emit.staging.plan`): a condition bound outside the
innermost loop is computed outside it (the compiler then unswitches the loop), and a branch
that calls a function under a condition that changes in the innermost loop is computed before
the choice, so the call is vectorised (the vector math functions are `notinbranch`); a
branch that is a load at the innermost level is loaded before the choice (a masked load of
an address the same in every lane is not vectorised: a top-k's gradient).

All are checked on the plan and on what gcc makes of the generated C: the gradient of a
logsumexp (`where(L is -inf, 0, exp(S - L))`) is vectorised, which it was not while the
condition, reading a row value, was printed inside the lane loop (7.5-13.8 ms instead of
1.0 ms for 4x4x256x256 elements on 2 cores)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import sympy

import tensordsl as td
from codegen.c.run.compiler import compile_flags
from codegen.emit.staging import Assign, Loop, plan
from codegen.ir.nest import Reduce, index_symbol, tensor_base
from tests.vectorised import unvectorised_simd_loops

i, j = index_symbol("i"), index_symbol("j")
S, L = tensor_base("S"), tensor_base("L")


def _assigned(p) -> list[list[str]]:
    return [[str(s) for s in level if isinstance(s, Assign)] for level in p.statements]


def test_a_condition_of_an_outer_level_is_computed_there() -> None:
    body = sympy.Piecewise((0, sympy.Eq(L[i], 2 * L[i])), (sympy.exp(S[i, j] - L[i]), True))
    p = plan(body, [[], [i], [j]], hoist_conditions=True)
    outer = _assigned(p)[1]
    assert any("Eq(" in s or "==" in s for s in outer), outer
    assert "exp" in str(p.value)  # the branch stays under the choice: the loop is unswitched


def test_a_call_under_a_condition_of_the_innermost_loop_is_computed_before_it() -> None:
    body = sympy.Piecewise((sympy.exp(S[i, j] - L[i]), S[i, j] > L[i]), (0, True))
    p = plan(body, [[], [i], [j]], hoist_conditions=True)
    inner = _assigned(p)[2]
    assert any("exp" in s for s in inner), inner
    assert "exp" not in str(p.value)


def test_an_index_comparison_stays_inline() -> None:
    body = sympy.Piecewise((sympy.exp(S[i, j] - L[i]), j <= i), (0, True))
    p = plan(body, [[], [i], [j]], hoist_conditions=True)
    assert "exp" in str(p.value) and _assigned(p)[2] == []


def test_a_load_under_a_condition_of_the_lanes_is_loaded_before_the_choice() -> None:
    # a nested sum inside the lanes: `dY[t, r]` is the same in every lane of `e`, and a
    # masked load of one address is what gcc's vectoriser cannot make
    t, e, r = (index_symbol(n) for n in "ter")
    A, dY = tensor_base("A"), tensor_base("dY")
    ranks = Reduce("sum", sympy.Piecewise((dY[t, r], sympy.Eq(e - A[t, r], 0)), (0, True)), r, 0, 2)
    p = plan(ranks * S[t, e], [[], [t], [e]], integer_tensors=frozenset({"A"}))
    (loop,) = [s for s in p.statements[2] if isinstance(s, Loop)]
    assert [str(s.expr) for s in loop.inner] == ["dY[t, r]"]
    assert "dY" not in str(loop.value)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_a_router_s_gradient_nests_are_vectorised(tmp_path) -> None:
    # softmax then top-2, fused: the gradient nests of R sum the two ranks in every lane
    # (each took 4x the time of its vectorised form on 2048 x 16 values: 0.13 -> 0.03 ms)
    router = td.program(
        """R[t,e] := X[t,d] * W[d,e]
        (logsumexp) L[t] := R[t,e]
        P[t,e] := exp(R[t,e] - L[t])
        (topk 2) G[t,r] := P[t,e]""",
        backend="c",
    )
    sources = router.source("c", {"X": (2048, 128), "W": (128, 16)})
    assert "strategy=dot" in sources["dL"]  # a nested sum of 2 ranks needs no scalar nest
    for name in ("dR", "dL"):
        assert "v_r" in sources[name]  # the ranks' nested sum
        assert unvectorised_simd_loops(sources[name], tmp_path) == [], name


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_the_logsumexp_gradient_is_vectorised(tmp_path) -> None:
    source = td.kernel("(logsumexp) L[b,h,i] := S[b,h,i,j]", backend="c").source()["grad_S"]
    c_file = tmp_path / "grad.c"
    c_file.write_text(source)
    command = ["gcc", *compile_flags(), "-fopt-info-vec-optimized", str(c_file), "-o"]
    done = subprocess.run([*command, str(tmp_path / "grad.so")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "loop vectorized" in done.stderr, done.stderr
