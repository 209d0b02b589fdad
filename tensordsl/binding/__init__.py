"""The JAX side: the primitive `nest_p` and its rules, partitioning, a fused program's
gradient, and the private JAX internals they need.
"""
