"""The strategies of attention's nests in the C emitter: the one-pass logsumexp and weighted
sum (online) and the multi-output nest (members); their rules in `rules`."""
