"""tensordsl: neural-network layers as index expressions, differentiated in JAX.

>>> import numpy as np, tensordsl as td
>>> dist = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="reference")
>>> dist.inputs
('W', 'X')
>>> dist(np.ones((2, 3)), np.zeros((2, 1))).tolist()
[[2.0], [2.0], [2.0]]
"""

from tensordsl import nn
from tensordsl.errors import (
    ArgumentCountError,
    ExpressionError,
    IndexExpressionError,
    IndexNameWarning,
    InputError,
    OptionError,
    ParseError,
    RangeError,
    ReductionError,
    ScheduleError,
    SettingError,
    ShapeError,
    TensorDSLError,
    TensorDSLWarning,
    UnknownNameError,
    UnsupportedError,
)
from tensordsl.kernel import Kernel, kernel, program
from tensordsl.program_kernel import ProgramKernel

__all__ = [
    "ArgumentCountError",
    "ExpressionError",
    "IndexExpressionError",
    "IndexNameWarning",
    "InputError",
    "Kernel",
    "OptionError",
    "ParseError",
    "ProgramKernel",
    "RangeError",
    "ReductionError",
    "ScheduleError",
    "SettingError",
    "ShapeError",
    "TensorDSLError",
    "TensorDSLWarning",
    "UnknownNameError",
    "UnsupportedError",
    "kernel",
    "nn",
    "program",
]
__version__ = "0.1.0"
