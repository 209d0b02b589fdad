"""Whether a nest's derivatives read its output, decided without deriving its tangent nest.

`tensordsl.binding.primitive._reads_output` decides from the reduction's gradient scale and the
gradient nests alone (reverse mode never builds the tangent nest). Over the whole corpus, for
every nest a JVP meets (each forward nest, its gradient nests under `jvp` of `grad`, its
tangent nest under forward over forward) and each perturbed set (each operand alone, all of
them), it equals the derived answer: whether the tangent nest or a gradient nest has an
operand in the "output" role.
"""

import numpy as np
import pytest

from codegen.errors import Unsupported
from codegen.passes import grad, gradient_rules, jvp
from tensordsl.binding.primitive import _reads_output
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.corpus import CORPUS, make_inputs


def derived(nest, perturbed):
    """The answer from the derived nests (what `_reads_output` computed before)."""
    try:
        roles = [
            *jvp.tangent(nest, perturbed).roles,
            *(role for w in perturbed for role in grad.gradient(nest, w).roles),
        ]
    except Unsupported:
        return True
    return any(role == gradient_rules.OUTPUT for _, role in roles)


def nests_met(case):
    """The forward nest of `case`, its gradient nests and its tangent nest."""
    nest = lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest
    if nest.online:  # differentiated as its two nests, each a corpus-like nest of its own
        return []
    inputs = make_inputs(case)
    names = tuple(
        n for n in nest.operand_names if np.issubdtype(np.asarray(inputs[n]).dtype, np.floating)
    )
    found = [nest]
    for name in names:
        found.append(grad.gradient(nest, name).nest)
    if names:
        found.append(jvp.tangent(nest, names).nest)
    return found


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_reads_output_equals_the_derived_answer(case):
    for nest in nests_met(case):
        names = nest.operand_names
        for perturbed in sorted({(n,) for n in names} | {names}):
            assert _reads_output(nest, perturbed) == derived(nest, perturbed), (
                f"{nest} perturbed in {perturbed}"
            )


def test_both_ways_of_reading_the_output_occur():
    """The corpus holds both: logsumexp's scale, and a gradient reusing the saved sum."""
    by_name = {c.name: c for c in CORPUS}
    logsumexp = nests_met(by_name["logsumexp_rows"])[0]
    denominator = nests_met(by_name["softmax_denominator"])[0]
    assert gradient_rules.reads_output(logsumexp)
    assert not gradient_rules.reads_output(denominator)
    assert _reads_output(denominator, ("M",)) and not _reads_output(denominator, ("X",))
