"""Device kernels, one module per op: `<op>_ref` (torch, any device), `<op>_cupy` (CuPy RawKernel) and
`<op>()` dispatching by device. The device decode loop's ops land here with their CPU references."""
