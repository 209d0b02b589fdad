"""Why the production "xla" path (`tensordsl/backends/xla_dot.py`) evaluates with the test
oracle's `Evaluator` (`tensordsl/backends/reference.py`), and what exactly it shares.

The "xla" path runs a nest's contractions as XLA's dot and the rest of each term in jnp. That
rest is the language's scalar meaning: the function table's jnp implementations, operations
kept as written (`IeeeAdd`, `IeeeMul`, `IeeeDiv`), the power rules (`x**0.5` as sqrt,
`x**-0.5` as rsqrt, integer powers), `where` as nested selects, masked-out reads clipped,
never wrapped. It must be the meaning the kernels and the oracle give, so it is written once,
in `Evaluator`; a second evaluator would be a second definition to keep in step (the Pallas
tile programs share it for the same reason). What is the production path's own is what makes
it fast, and it overrides exactly that: plain accesses as transposed views and nested
contractions as einsums placed on the grid (`_XlaEvaluator.access`, `.nested`), the dots
and their prologues.

The oracle stays independent where it matters: the tests of the "xla" path
(`tests/jax/test_xla_contractions.py`) check it against float64 numpy formulas (`A @ B`,
`np.einsum`), not against `reference.evaluate`, and the shared scalar meaning is checked
against jnp row by row (`test_tables.py`) and by the corpus on every back end.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from tensordsl.backends import reference, xla_dot
from tensordsl.backends.pallas import lower as pallas_lower

ROOT = Path(__file__).resolve().parents[2]


def _taken_from_the_oracle(path: Path) -> set[str]:
    """The names a module imports from `tensordsl.backends.reference`."""
    tree = ast.parse(path.read_text())
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "tensordsl.backends.reference"
        for alias in node.names
    }


def test_the_xla_path_shares_the_evaluator_and_the_grid_and_nothing_else() -> None:
    shared = _taken_from_the_oracle(ROOT / "tensordsl/backends/xla_dot.py")
    # `Points` is the grid's type: the evaluator reads each index's span from it.
    assert shared == {"Evaluator", "Points", "REDUCE", "compute_dtype", "grid", "term_values"}
    assert "evaluate" not in shared  # never the oracle's result itself


def test_the_xla_evaluator_overrides_only_accesses_and_nested_contractions() -> None:
    own = xla_dot._XlaEvaluator
    assert issubclass(own, reference.Evaluator)
    overridden = {
        name
        for name, value in vars(own).items()
        if inspect.isfunction(value) and hasattr(reference.Evaluator, name)
    }
    assert overridden == {"__init__", "access", "nested"}
    # The scalar meaning (functions, powers, selects) is inherited, not rewritten.
    for name in ("__call__", "power", "piecewise", "symbol"):
        assert getattr(own, name) is getattr(reference.Evaluator, name)


def test_the_xla_path_reduces_only_by_the_oracles_sum() -> None:
    """Its terms are summed (`xla_plan` accepts sum nests only), by the oracle's `_sum`, whose
    dot with ones avoids a miscompiled CPU reduce (docs/backends.md)."""
    tree = ast.parse((ROOT / "tensordsl/backends/xla_dot.py").read_text())
    keys = {
        node.slice.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "REDUCE"
        and isinstance(node.slice, ast.Constant)
    }
    assert keys == {"sum"}


def test_the_pallas_tiles_share_the_evaluator_alone() -> None:
    path = ROOT / "tensordsl/backends/pallas/lower.py"
    assert _taken_from_the_oracle(path) == {"Evaluator"}
    assert any(
        issubclass(c, reference.Evaluator)
        for _, c in inspect.getmembers(pallas_lower, inspect.isclass)
    )
