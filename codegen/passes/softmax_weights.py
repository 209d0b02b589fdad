"""Softmax weights `exp(X - L)` computed from the score `X` whole, as the logsumexp `L` was.

Attention's weighted sum reads its logsumexp as `exp(S + A[h]*(j - i) - L)`; sympy keeps
that as one sum of three summands and the generated code adds them in its own order,
`(A[h]*(j - i) - L) + S`. The logsumexp's pass computed the score `X = S + A[h]*(j - i)`
first and rounded it, in float32 by an ulp of its size: hundreds where ALiBi's slopes
times distances are. So the weights that the backward recomputes differed from the
forward's by such an ulp each, independently, while the forward's output and the
logsumexp's cotangent (`-sum_e dO * O`) carry the forward's: each row of the scores'
cotangent `dS = P * (dP - D)` then no longer sums to the logsumexp's own cotangent, and a
gradient that weights `dS` by distances (ALiBi's slopes, `sum dS * (j - i)`) multiplies
that by up to T (docs/nn.md, "Its accuracy in float32").

`softmax_weights` writes each such weight as `exp(Shifted(X, -L))` (`codegen.ir.ieee.
shifted`, printed `(X - L)`: `X` summed first), as the logsumexp's own gradient rule
does (`codegen.ir.reductions`): the weights are then the forward's, to the rounding of
`L` itself, which is the same for a whole row and cancels from `dS` (the forward's output
is normalised by its own sum). Only where `X - L` is a weight of a logsumexp of `X` and
`X` has several summands: elsewhere the code is unchanged.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j, e = index_symbol("i"), index_symbol("j"), index_symbol("e")
>>> S, A, L, V = tensor_base("S"), tensor_base("A"), tensor_base("L"), tensor_base("V")
>>> rows, keys = Range(i, 0, extent_symbol("S", 0)), Range(j, 0, extent_symbol("S", 1))
>>> width = Range(e, 0, extent_symbol("V", 1))
>>> lse = LoopNest("L", (rows,), (Term(S[i, j] + A[0] * (j - i), (keys,)),),
...     (Operand("S", 2), Operand("A", 1)), "logsumexp")
>>> k = index_symbol("k")  # the weighted sum's own name for the key
>>> out = LoopNest("O", (rows, width),
...     (Term(sympy.exp(S[i, k] + A[0] * (k - i) - L[i]) * V[k, e],
...           (Range(k, 0, extent_symbol("S", 1)),)),),
...     (Operand("S", 2), Operand("A", 1), Operand("L", 1), Operand("V", 2)))
>>> softmax_weights((lse, out))[1].terms[0].body
exp(Shifted((-i + k)*A[0] + S[i, k], -L[i]))*V[k, e]
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import sympy

from codegen.ir.ieee import Shifted, shifted
from codegen.ir.nest import LoopNest, Term


def softmax_weights(nests: Sequence[LoopNest]) -> tuple[LoopNest, ...]:
    """`nests` with every weight `exp(X - L[...])` of a logsumexp `L` of `X` (a nest of
    one term) that a later nest reads written as `exp(Shifted(X, -L[...]))` (module
    docstring); the nests themselves where there is none."""
    found = list(nests)
    for lse in nests:
        if lse.reduction != "logsumexp" or len(lse.terms) != 1:
            continue
        for n, nest in enumerate(found):
            if lse.output in nest.operand_names and nest is not lse:
                terms = tuple(_term(term, nest, lse) for term in nest.terms)
                if terms != nest.terms:
                    found[n] = dataclasses.replace(nest, terms=terms)
    return tuple(found)


def _term(term: Term, nest: LoopNest, lse: LoopNest) -> Term:
    """`term` with each weight of `lse` in its body written whole-score first."""
    replaced = {}
    for weight in term.body.atoms(sympy.exp):
        found = _score(weight.args[0], term, nest, lse)
        if found is not None:
            replaced[weight] = shifted(*found)
    return dataclasses.replace(term, body=term.body.xreplace(replaced)) if replaced else term


def _score(
    argument: sympy.Expr, term: Term, nest: LoopNest, lse: LoopNest
) -> tuple[sympy.Expr, sympy.Indexed] | None:
    """(X, L[...]) where `argument` is `X - L[...]`, X the logsumexp's score at this term's
    indices and a sum of several summands; else None."""
    if isinstance(argument, Shifted) or not isinstance(argument, sympy.Add):
        return None
    reads = [a for a in argument.atoms(sympy.Indexed) if a.base.name == lse.output]
    if len(reads) != 1:
        return None
    (read,) = reads
    score = argument + read
    if score.has(read.base) or not isinstance(score, sympy.Add):
        return None
    (own,) = lse.terms
    named = dict(zip(lse.free_indices, read.indices))
    loops = [x for x in (*nest.free_indices, *term.reduced_indices) if x not in read.indices]
    for chosen in itertools.permutations(loops, len(own.reduced_indices)):
        mapping = {**named, **dict(zip(own.reduced_indices, chosen))}
        if own.body.xreplace(mapping) == score:
            return score, read
    return None


__all__ = ["softmax_weights"]
