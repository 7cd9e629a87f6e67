"""The GPU's kernels: the device loop's ops, one module each (`<op>_ref` in torch, any device; `<op>_cupy`,
a CuPy RawKernel; `<op>()` dispatching by device), the Triton paged decode attention, and CudaInt4Linear
(4-bit weights through torch's int4 kernel); cupy_support holds what the CuPy kernels share (lazy CuPy,
launch contracts, compile at start)."""
