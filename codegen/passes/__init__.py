"""IR -> IR passes, each a pure function: guards as bounds, sum factorisation, inlining,
fusion, the one-pass pairing, batching (vmap), and differentiation (gradient nests).
"""
