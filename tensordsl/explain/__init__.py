"""Diagnostics: a kernel's nests, ranges and schedules in words (`nests`), the static CUDA
report (`gpu_report`) and the time of each nest alone (`timing`)."""
