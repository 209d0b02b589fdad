"""From source text to loop nests: parse, translate, ranges, lower, statements of a
program, and the call-time checks of shapes and arguments.
"""
