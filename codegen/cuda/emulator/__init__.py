"""Run generated CUDA on the CPU: a header of the CUDA execution model and its launcher."""
