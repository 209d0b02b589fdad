"""The one-pass attention kernels: online and weighted (`online`, its `scores` from staged
`key_tiles` and `query_tiles`), the dK+dV pair (`paired`, `pair_tiles`) and their counts
for explain (`tile_counts`)."""
