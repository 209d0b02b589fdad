"""The CUDA strategies that stage operand tiles in shared memory: smem (`tiles`), mma on
tensor cores (`mma`, `fragments`) and pairwise; `shared` declares every kernel's shared arrays."""
