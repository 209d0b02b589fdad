"""Building and running generated C: the compiler probe (`compiler`), tiered builds (`tiers`),
shared objects and their caches (`build`, `records`, `renaming`), the loaded kernel
(`compiled`) and the XLA FFI handler (`ffi`)."""
