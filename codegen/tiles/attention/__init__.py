"""Attention tile programs: FlashAttention's forward and backward kernels derived from loop
nests (`program.py`: the data; `build.py`: found in a nest; `pairs.py`: dK and dV as one)."""
