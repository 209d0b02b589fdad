"""The CUDA back end: the CUDA dialect, its schedules and strategies, NVRTC, the launch
handler, and the emulator that runs CUDA on the CPU.
"""
