"""The baselines the benchmarks time beside the library: the PyTorch decode (torch_mla), our
Triton decode (triton_mla), the unfused PyTorch layer (torch_layer), and their self-test against
the float64 reference (selftest)."""
