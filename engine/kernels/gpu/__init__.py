"""The GPU's kernels, one module per op: `<op>_ref` (torch, any device), `<op>_cupy` (a CuPy RawKernel)
and `<op>()` dispatching by device, beside the Triton paged decode attention; cupy_support holds what the
CuPy kernels share (lazy CuPy, launch contracts, compile at start)."""
