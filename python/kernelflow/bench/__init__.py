"""The benchmarks of the library, runnable from an installed package.

`python -m kernelflow bench` (cli) runs them all on the GPU at hand; the modules run alone too:
peaks (the GPU's read and mma.sync ceilings), decode (the decode grid and the cache formats beside
the baselines), layer (the fused decode layer against the unfused PyTorch layer), plots (the
figures), profile (`python -m kernelflow profile`: Nsight Compute on one decode, the layer graph's
kernel count), baselines (the Triton and PyTorch decodes, the unfused layer). bench/README.md
describes the method.
"""
