"""The C helpers that walk a tile grid at run time, written once into every C source: how many
tiles an axis has (`tdsl_tiles`) and where each starts and how wide it is (`tdsl_tile`). The
tile strategies (`codegen.c.tiles.tiles`) print calls of them into their grid loops."""

TILE_HELPERS = """\
/* Tiles of S along [s, z) with the interior part [a, e) (s <= a <= e <= z) tiled from a:
 * chunks of at most S in [s, a), in [a, e) and in [e, z). */
static inline int64_t tdsl_tiles(int64_t s, int64_t a, int64_t e, int64_t z, int64_t S) {
    return (a - s + S - 1) / S + (e - a + S - 1) / S + (z - e + S - 1) / S;
}
/* Tile t: its start, its width in *n. The last tile of a part at least S long moves back
 * to end where the part ends, a whole tile (constant trip counts) whose first *k rows or
 * lanes the tile before it already stores. */
static inline int64_t tdsl_tile(int64_t t, int64_t s, int64_t a, int64_t e, int64_t z,
                                int64_t S, int64_t *n, int64_t *k) {
    const int64_t na = (a - s + S - 1) / S, ni = (e - a + S - 1) / S;
    const int64_t x0 = t < na ? s + t * S : t < na + ni ? a + (t - na) * S : e + (t - na - ni) * S;
    const int64_t from = t < na ? s : t < na + ni ? a : e, to = t < na ? a : t < na + ni ? e : z;
    *n = tdsl_imin(S, to - x0);
    *k = 0;
    if (*n < S && to - from >= S) {
        *k = S - *n;
        *n = S;
        return to - S;
    }
    return x0;
}"""
