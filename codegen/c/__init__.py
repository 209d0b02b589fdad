"""The C back end: the C dialect, its schedules and strategies, and the build (compiler
probe, shared objects, the XLA FFI handler).
"""
