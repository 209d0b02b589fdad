"""The reduction strategies of the CUDA emitter: thread, tile, block (`simple`), rows,
columns and split; each writes its loops into a `codegen.cuda.dialect.CudaEmitter`."""
