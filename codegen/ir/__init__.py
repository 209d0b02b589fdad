"""The IR: loop nests and programs (frozen, hashable), and what only reads them: affine
index forms, the scalar-function and reduction tables, extents, loop bounds, contractions,
host parameters, printing back as source.
"""
