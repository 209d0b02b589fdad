"""The register-tile strategies of the C emitter: tile (`tiles`), dot (`dot`) and unroll
(`unroll`), with the rows they bind (`rows`), their lane masks (`padding`), long cases as
functions of their own (`outline`), the run-time grid helpers (`grid`); their rules in
`rules`."""
