"""The reduction strategies of the C emitter: scalar and split (`simple`, with the parallel
loop every strategy shares) and topk's select; their rules in `rules`."""
