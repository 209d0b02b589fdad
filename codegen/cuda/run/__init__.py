"""Generated CUDA compiled (`nvrtc`: NVRTC to PTX or CUBIN) and launched from XLA without
Python (`launch`, the FFI handlers of `ffi.cc`)."""
