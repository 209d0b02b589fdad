"""How many threads a C kernel starts: by the size of its work, sharing the cores.

A team of OpenMP threads costs little on an idle machine (tens of microseconds to wake a
sleeping thread) but a great deal on a busy one: the team's last thread to reach the end of
the loop may wait for a core another process holds, and the kernel waits with it, for
milliseconds, whatever its own work (benchmarks/threads.py). So a kernel starts a team only for
work that amortises that risk, and never more threads than cores are free:

* the work is counted in *units*, about one arithmetic operation or one load each
  (`body_cost`), not in evaluations of the body: a sum of products and a sum of
  exponentials of the same extents differ tenfold (`nest_work` is the count for a nest,
  `work_` in the generated C);
* a kernel runs on one thread below two `GRAIN`s of work, else on one thread per `GRAIN`
  up to the threads OpenMP may use (`omp_get_max_threads()`: `OMP_NUM_THREADS`, else the
  CPUs the process may run on);
* less the threads that teams of other tensordsl kernels hold at that moment: XLA may run
  two kernels at once on its own threads, and each would otherwise start a full team (4
  threads on 2 cores). Every kernel's library has a pointer, `tdsl_teams_held`, that the
  loader (`share_counter`) points at one counter of the process; a team is reserved with an
  atomic compare-and-swap before it starts and given back when the kernel returns;
* waiting threads sleep rather than spin: before the first kernel loads (and with it the
  OpenMP runtime, which reads its environment once), `passive_waiting` sets
  `OMP_WAIT_POLICY=passive` unless the user set `OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`
  (`codegen.config.openmp_wait_defaults`). A spinning thread holds a core that XLA's own
  threads, or the next kernel, could use.

`thread_count` is the rule in Python, the twin of the C helper `tdsl_team` (tested against
it). Which thread computes which output element does not change any result: each element
is still computed by one thread, in the same order.

>>> thread_count(1_000, cores=2), thread_count(2 * GRAIN, cores=2)
(1, 2)
>>> thread_count(100 * GRAIN, cores=2, held=2), thread_count(100 * GRAIN, cores=16, held=2)
(1, 14)
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, Sequence

import sympy

from codegen import config
from codegen.ir.host import host_function
from codegen.ir.nest import LoopNest

#: Work units one more thread must have for a team to be worth starting: a fraction of a
#: millisecond on one core, between vectorised multiply-adds and a body with an `exp`.
GRAIN = 1 << 23
#: Units of one call of a scalar function (`exp`, `tanh`, `erf`, a non-integer power).
FUNCTION_COST = 16

#: The OpenMP clauses of every parallel loop: `threads_` is `tdsl_team(work_)`.
CLAUSES = "num_threads(threads_) if(threads_ > 1)"


def thread_count(work: int, cores: int, held: int = 0) -> int:
    """The threads a kernel of `work` units starts when OpenMP may use `cores` threads and
    other kernels' teams hold `held` of them (the rule of `tdsl_team`, see the module
    docstring)."""
    if work < 2 * GRAIN:
        return 1
    wanted = min(work // GRAIN, cores - held)
    return wanted if wanted > 1 else 1


def body_cost(body: sympy.Basic) -> int:
    """Work units of one evaluation of a term's body: one per load, per arithmetic
    operation and for the update of the result, `FUNCTION_COST` per scalar function call.
    Index arithmetic inside an access is not counted (it is hoisted or strength-reduced)."""
    cost, stack = 1, [body]
    while stack:
        node = stack.pop()
        if isinstance(node, sympy.Indexed):
            cost += 1
            continue
        if isinstance(node, sympy.Pow):
            cost += 1 if node.exp.is_Integer else FUNCTION_COST
        elif isinstance(node, (sympy.Add, sympy.Mul)):
            cost += len(node.args) - 1
        elif isinstance(node, sympy.Function):
            cost += FUNCTION_COST
        stack.extend(node.args)
    return cost


def work_expression(nest: LoopNest) -> sympy.Expr:
    """The work units of `nest` in terms of its extents: per output element, one store and
    each term's `body_cost` per evaluation."""

    def count(ranges: Sequence) -> sympy.Expr:
        return sympy.Mul(*(sympy.Max(r.stop - r.start, 0) for r in ranges))

    per_element = sympy.Add(*(body_cost(t.body) * count(t.reduced) for t in nest.terms))
    return count(nest.free) * (1 + per_element)


def nest_work(nest: LoopNest, shapes: Mapping[str, Sequence[int]]) -> int:
    """`work_expression` for tensors of these shapes (every tensor its ranges name).

    >>> from codegen.ir.examples import matmul
    >>> nest_work(matmul(), {"A": (4, 3), "B": (3, 5)})  # 20 elements, 3 terms of 4 units
    260
    """
    return int(host_function([("work_", work_expression(nest))]).values(shapes)[0])


# --------------------------------------------------------------------------- the C side

#: The helpers every kernel with a parallel loop includes (the twin of `thread_count`).
HELPERS = f"""\
/* Threads for `work` units (codegen/c/threads.py): one below two grains, else one per grain,
 * up to OpenMP's threads less those other kernels' teams hold (reserved until tdsl_team_done). */
#ifdef _OPENMP
#include <omp.h>
int *tdsl_teams_held = 0; /* the process's counter, set by the loader; else this library's */
static int tdsl_teams_own_;
static inline int *tdsl_teams_(void) {{
    return tdsl_teams_held ? tdsl_teams_held : &tdsl_teams_own_;
}}
static int tdsl_team(int64_t work) {{
    if (work < 2 * (int64_t){GRAIN}) return 1;
    const int64_t cores = omp_get_max_threads();
    int held = __atomic_load_n(tdsl_teams_(), __ATOMIC_RELAXED);
    for (;;) {{
        int64_t n = work / {GRAIN};
        if (n > cores - held) n = cores - held;
        if (n < 2) return 1;
        if (__atomic_compare_exchange_n(tdsl_teams_(), &held, held + (int)n, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return (int)n;
    }}
}}
static void tdsl_team_done(int threads) {{
    if (threads > 1) __atomic_fetch_sub(tdsl_teams_(), threads, __ATOMIC_ACQ_REL);
}}
#else
static inline int tdsl_team(int64_t work) {{ (void)work; return 1; }}
static inline void tdsl_team_done(int threads) {{ (void)threads; }}
#endif"""

#: The exported pointer `share_counter` sets in each library.
COUNTER_SYMBOL = "tdsl_teams_held"

_HELD = ctypes.c_int(0)  # the process's counter: threads held by kernels' teams now
_PASSIVE_LOCK = threading.Lock()


def share_counter(library: ctypes.CDLL) -> None:
    """Point `library`'s team counter at the process's one (a library built without OpenMP,
    or without a parallel loop, has none: nothing to do)."""
    try:
        pointer = ctypes.c_void_p.in_dll(library, COUNTER_SYMBOL)
    except ValueError:
        return
    pointer.value = ctypes.addressof(_HELD)


def teams_held() -> int:
    """Threads the teams of running kernels hold now (0 when none runs)."""
    return _HELD.value


def passive_waiting() -> None:
    """Set `codegen.config.openmp_wait_defaults()` in the environment, before the OpenMP
    runtime loads with the first kernel (it reads the environment once, when it loads)."""
    with _PASSIVE_LOCK:
        for name, value in config.openmp_wait_defaults().items():
            os.environ.setdefault(name, value)
