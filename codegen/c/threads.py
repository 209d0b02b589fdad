"""How many threads a C kernel starts: by the size of its work, sharing the cores.

A team of OpenMP threads costs little on an idle machine (tens of microseconds to wake a
sleeping thread) but a great deal on a busy one: the team's last thread to reach the end of
the loop may wait for a core another process holds, and the kernel waits with it, for
milliseconds, whatever its own work (benchmarks/threads.py). So a kernel starts a team only for
work that amortises that risk, and never more threads than cores are free:

* the work is counted in *units*, about one arithmetic operation or one load each
  (`body_cost`), not in evaluations of the body: a sum of products and a sum of
  exponentials of the same extents differ many times over (`nest_work` counts a nest,
  `work_` in the generated C);
* a kernel runs on one thread below two `GRAIN`s of work, else on one thread per `GRAIN`
  up to the threads OpenMP may use (`omp_get_max_threads()`: `OMP_NUM_THREADS`, else the
  CPUs the process may run on);
* less the threads that teams of other tensordsl kernels hold at that moment: XLA may run
  two kernels at once on its own threads, and each would otherwise start a full team (4
  threads on 2 cores). Every kernel's library has a pointer, `tdsl_teams`, that the
  loader (`share_counter`) points at one record of the process (`Teams`); a team is
  reserved with an atomic compare-and-swap before it starts and given back when the kernel
  returns;
* and on one thread while the machine is crowded: each thread of a team but the first
  notes when it starts; one that starts more than `LATE_NS` after its kernel asked for the
  team found every core taken (by other processes, XLA's threads, another team), and
  kernels then start no team for `CALM_NS`. So on a machine whose cores are all busy, a
  kernel pays the wait for a core about once per `CALM_NS`, not at every call; on an idle
  one no thread is late and every large kernel uses every core;
* waiting threads spin briefly, then sleep: before the first kernel loads (and with it the
  OpenMP runtime, which reads its environment once), `openmp_waiting` sets
  `GOMP_SPINCOUNT=30000` (about 2 ms) unless the user set `OMP_WAIT_POLICY`,
  `GOMP_SPINCOUNT` or `KMP_BLOCKTIME` (`codegen.config.openmp_wait_defaults`). Sleeping at
  once (`OMP_WAIT_POLICY=passive`, the rule until 2026-12-07) left the next kernel's team
  to wake a sleeping thread, which then took its waker's core: a team of two ran on one
  core (benchmarks/RESULTS.md, "rowpar"); spinning for ever would hold a core that XLA's
  own threads could use. Measured on the natural rows and the GPT block, quiet machine
  (RESULTS.md, "Waiting: spin, then sleep").

`thread_count` is the rule in Python, the twin of the C helper `tdsl_team` (tested against
it); `codegen.c.reductions.simple.parallel_loop` wraps a kernel's loop in its parallel region.
Which thread computes which output element does not change any result: each element is
still computed by one thread, in the same order.

>>> thread_count(1_000, cores=2), thread_count(2 * GRAIN, cores=2)
(1, 2)
>>> thread_count(100 * GRAIN, cores=2, held=2), thread_count(100 * GRAIN, cores=16, held=2)
(1, 14)
>>> thread_count(100 * GRAIN, cores=2, crowded=True)
1
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping, Sequence

import sympy

from codegen import config
from codegen.ir.host import host_function
from codegen.ir.nest import LoopNest, Reduce
from codegen.ir.reductions import REDUCTIONS

#: Work units one more thread must have for a team to be worth starting: about 0.3 ms on
#: one core of this project's machine (the Gaussian kernel at 256x256x3, 5.2 million units,
#: ran in 0.67 ms on one thread), many times the tens of microseconds an idle machine
#: takes to wake a sleeping thread; a crowded machine is caught by `LATE_NS` instead.
GRAIN = 1 << 21
#: Units of one call of a scalar function (`exp`, `tanh`, `erf`, a non-integer power).
FUNCTION_COST = 64

#: A thread of a team that starts this long after its kernel asked for the team found no
#: free core: the machine is crowded. Not less: on an idle machine a team thread may start
#: a millisecond or more late after XLA's own threads ran (they spin a while before they
#: sleep), and at 1 ms every kernel of the attention sub-layer's backward ran on one thread
#: (5.7 ms against 4.3 ms without the back-off, `benchmarks/natural.py`, idle machine).
LATE_NS = 10_000_000
#: After a late thread, kernels run on one thread for this long, then try a team again.
CALM_NS = 1_000_000_000

#: The OpenMP clauses of every parallel region: `threads_` is `tdsl_team(work_, ...)`.
CLAUSES = "num_threads(threads_) if(threads_ > 1)"


def thread_count(work: int, cores: int, held: int = 0, *, crowded: bool = False) -> int:
    """The threads a kernel of `work` units starts when OpenMP may use `cores` threads,
    other kernels' teams hold `held` of them, and a team started late less than `CALM_NS`
    ago (`crowded`): the rule of `tdsl_team` (see the module docstring)."""
    if work < 2 * GRAIN or crowded:
        return 1
    wanted = min(work // GRAIN, cores - held)
    return wanted if wanted > 1 else 1


def update_cost(reduction: str) -> int:
    """Work units of folding one value into a `reduction`'s state beyond the one every
    update is counted: `FUNCTION_COST` per scalar function call its update makes. A
    logsumexp computes `exp` of every value it reduces: its nests do the work of a sum of
    `exp`s of the same extents, and get the same team (counted as a plain sum, Sinkhorn's
    row and column logsumexps over 512x512 stayed on one thread where XLA used every core).

    >>> update_cost("sum"), update_cost("max"), update_cost("logsumexp") == FUNCTION_COST
    (0, 0, True)
    """
    return REDUCTIONS[reduction].calls * FUNCTION_COST


def body_cost(body: sympy.Basic) -> sympy.Expr:
    """Work units of one evaluation of a term's body: one per load, per arithmetic
    operation and for the update of the result, `FUNCTION_COST` per scalar function call,
    and a nested reduction's body and update (`update_cost`) as many times as its loop runs
    (in terms of its extents: `sum_s(X[n,c,s] * dY[n,c,s])` inside a gradient reads two
    whole tensors, not two elements). Index arithmetic inside an access is not counted (it
    is hoisted or strength-reduced)."""
    cost: sympy.Expr = sympy.Integer(1)
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, sympy.Indexed):
            cost += 1
            continue
        if isinstance(node, Reduce):
            update = body_cost(node.body) + update_cost(node.reduction)
            cost += sympy.Max(node.stop - node.start, 0) * update
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
    each term's `body_cost` and its reduction's `update_cost` per evaluation."""

    def count(ranges: Sequence) -> sympy.Expr:
        return sympy.Mul(*(sympy.Max(r.stop - r.start, 0) for r in ranges))

    update = update_cost(nest.reduction)
    per_element = sympy.Add(*((body_cost(t.body) + update) * count(t.reduced) for t in nest.terms))
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
 * up to OpenMP's threads less those other kernels' teams hold (reserved until tdsl_team_done);
 * one while the machine is crowded (a team's thread started late less than CALM_NS ago). */
#ifdef _OPENMP
#include <omp.h>
#include <time.h>
typedef struct {{
    int held;           /* threads the teams of running kernels hold */
    int64_t calm_until; /* CLOCK_MONOTONIC ns before which kernels start no team */
}} tdsl_teams_t;
tdsl_teams_t *tdsl_teams = 0; /* the process's, set by the loader; else this library's */
static tdsl_teams_t tdsl_teams_own_;
static inline tdsl_teams_t *tdsl_teams_(void) {{
    return tdsl_teams ? tdsl_teams : &tdsl_teams_own_;
}}
static inline int64_t tdsl_now_ns(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}}
static int tdsl_team(int64_t work, int64_t *asked) {{
    if (work < 2 * (int64_t){GRAIN}) return 1;
    tdsl_teams_t *teams = tdsl_teams_();
    *asked = tdsl_now_ns();
    if (*asked < __atomic_load_n(&teams->calm_until, __ATOMIC_RELAXED)) return 1;
    const int64_t cores = omp_get_max_threads();
    int held = __atomic_load_n(&teams->held, __ATOMIC_RELAXED);
    for (;;) {{
        int64_t n = work / {GRAIN};
        if (n > cores - held) n = cores - held;
        if (n < 2) return 1;
        if (__atomic_compare_exchange_n(&teams->held, &held, held + (int)n, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            return (int)n;
    }}
}}
/* A thread of a team started at `now`, its kernel asked for the team at `asked`. */
static void tdsl_team_started(int64_t asked, int64_t now) {{
    if (now - asked > {LATE_NS})
        __atomic_store_n(&tdsl_teams_()->calm_until, now + {CALM_NS}, __ATOMIC_RELAXED);
}}
static inline void tdsl_team_arrived(int64_t asked) {{
    if (omp_get_thread_num() > 0) tdsl_team_started(asked, tdsl_now_ns());
}}
static void tdsl_team_done(int threads) {{
    if (threads > 1) __atomic_fetch_sub(&tdsl_teams_()->held, threads, __ATOMIC_ACQ_REL);
}}
#else
static inline int tdsl_team(int64_t work, int64_t *asked) {{
    (void)work;
    (void)asked;
    return 1;
}}
static inline void tdsl_team_arrived(int64_t asked) {{ (void)asked; }}
static inline void tdsl_team_done(int threads) {{ (void)threads; }}
#endif"""

#: The exported pointer `share_counter` sets in each library.
COUNTER_SYMBOL = "tdsl_teams"


class Teams(ctypes.Structure):
    """The process's `tdsl_teams_t`: what every loaded kernel reads and updates."""

    _fields_ = (("held", ctypes.c_int), ("calm_until", ctypes.c_int64))


_TEAMS = Teams(0, 0)
_WAITING_LOCK = threading.Lock()


def share_counter(library: ctypes.CDLL) -> None:
    """Point `library`'s `tdsl_teams` at the process's one (a library built without OpenMP,
    or without a parallel loop, has none: nothing to do)."""
    try:
        pointer = ctypes.c_void_p.in_dll(library, COUNTER_SYMBOL)
    except ValueError:
        return
    pointer.value = ctypes.addressof(_TEAMS)


def teams() -> Teams:
    """The process's counter: `held` threads now, `calm_until` (CLOCK_MONOTONIC ns)."""
    return _TEAMS


def openmp_waiting() -> None:
    """Set `codegen.config.openmp_wait_defaults()` in the environment, before the OpenMP
    runtime loads with the first kernel (it reads the environment once, when it loads)."""
    with _WAITING_LOCK:
        for name, value in config.openmp_wait_defaults().items():
            os.environ.setdefault(name, value)
