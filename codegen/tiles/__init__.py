"""Tile programs: a loop nest as a grid of program instances over output tiles, with tile
loops over reduced indices, operand tile loads, dots, tile reductions and per-tile bounds
(`program.py`), built for concrete shapes by `build.tile_program`. Pure Python: the lowerings
(`tensordsl/backends/pallas/`) import it, never the other way round.
"""
