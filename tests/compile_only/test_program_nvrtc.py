"""Every nest of the attention and cross-entropy programs of the corpus compiles with NVRTC
(sm_90): each statement's forward nest, its auxiliary nests and the gradient nest of each of
its float operands, intermediates included. (The other programs' statements are shaped like
the single-statement corpus, which `test_nvrtc.py` compiles; all 85 nests of the program
corpus took 25 s, 9 s of CPU, on the shared 2-core test machine.) Needs NVRTC only, no GPU."""

from __future__ import annotations

import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.run import nvrtc
from codegen.ir.nest import LoopNest
from codegen.passes import grad, gradient_rules
from tensordsl.frontend.statements import lower_program
from tests.programs import PROGRAMS_BY_NAME

#: Programs with what the single-statement corpus lacks: `inf` masks, intermediates read by
#: logsumexp and exp(S - L) weights, an index compared with an integer tensor.
COMPILED = ("causal_attention", "relative_bias_attention", "cross_entropy")

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason='NVRTC unavailable: pip install "cupy-cuda13x[ctk]"'
)


def program_nests() -> list[tuple[str, LoopNest, frozenset[str]]]:
    """`(id, nest, integer tensors)` for every nest the programs of the corpus run."""
    found = []
    for case in (PROGRAMS_BY_NAME[name] for name in COMPILED):
        integer = frozenset(name for name, arg in case.args.items() if arg.integer)
        for nest in lower_program(case.source, outputs=case.outputs).program.statements:
            found.append((f"{case.name}-{nest.output}-forward", nest, integer))
            for role, aux in gradient_rules.auxiliary_nests(nest).items():
                found.append((f"{case.name}-{nest.output}-{role}", aux, integer))
            for op in nest.operands:
                if op.name not in integer:
                    gradient = grad.gradient(nest, op.name).nest
                    found.append((f"{case.name}-{nest.output}-grad_{op.name}", gradient, integer))
    return found


NESTS = program_nests()


@pytest.mark.parametrize(("name", "nest", "integer"), NESTS, ids=[n for n, _, _ in NESTS])
def test_program_nest_compiles_for_sm90(name, nest, integer):
    dtypes = {n: "int32" if n in integer else "float32" for n in nest.operand_names}
    dtypes[nest.output] = "int32" if nest.reduction in ("argmax", "argmin") else "float32"
    source = emit_cuda(nest, dtypes=dtypes, role=name.rsplit("-", 1)[1])
    ptx = nvrtc.compile_source(source.text, arch="compute_90").ptx
    assert f".entry {source.entry}(" in ptx


def fused_attention_nests() -> list[LoopNest]:
    """The nests a forward+backward call of causal attention runs on CUDA (fused): the
    one-pass forward (online strategy) and dQ, dK, dV (weighted), B 8 H 12 T 1024 E 64."""
    import tensordsl as td
    from codegen.cuda.schedule import choose_gpu_schedule
    from tensordsl.explain.timing import nest_equations

    k = td.kernel(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"))
    shape = (8, 12, 1024, 64)
    shapes = {"Q": shape, "K": shape, "scale": (), "V": shape}
    nests = [eqn.params["nest"] for eqn in nest_equations(k._call_jaxpr(shapes, "float32"))]
    return [
        n for n in nests if choose_gpu_schedule(n, kernel=True).strategy in ("online", "weighted")
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_the_attention_kernels_compile_without_spills(dtype):
    nests = fused_attention_nests()
    assert sorted(n.label for n in nests) == ["O+L", "dK", "dQ", "dV"]
    for nest in nests:
        dtypes = {n: dtype for n in (*nest.operand_names, nest.output)}
        source = emit_cuda(nest, dtypes=dtypes)
        cubin = nvrtc.compile_source(source.text, arch="sm_90", options=["--ptxas-options=-v"])
        assert (cubin.spill_stores, cubin.spill_loads) == (0, 0), (nest.label, cubin.log)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_paired_gradient_kernel_compiles_without_spills(dtype):
    """On CUDA, a call asks for dK and dV together: one weighted kernel with two outputs
    (`codegen.cuda.attention.paired`), within the static shared memory and its registers."""
    import tensordsl as td
    from codegen.cuda.layout import split_paired
    from tensordsl.explain.timing import nest_equations

    k = td.kernel(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"))
    shape = (8, 12, 1024, 64)
    shapes = {"Q": shape, "K": shape, "scale": (), "V": shape}
    jaxpr = k._call_jaxpr(shapes, dtype, backend="cuda")
    nests = [eqn.params["nest"] for eqn in nest_equations(jaxpr)]
    (pair,) = [n for n in nests if split_paired(n) is not None]
    assert pair.label == "dV_dK" and "dK" not in [n.label for n in nests]
    dtypes = {n: dtype for n in (*pair.operand_names, pair.output)}
    source = emit_cuda(pair, dtypes=dtypes)
    assert "strategy=weighted" in source.text and "ss2_" in source.text
    cubin = nvrtc.compile_source(source.text, arch="sm_90", options=["--ptxas-options=-v"])
    assert (cubin.spill_stores, cubin.spill_loads) == (0, 0), cubin.log
