"""Our kernels by backend: cpu/ (C++ through torch.utils.cpp_extension) and gpu/ (CuPy and Triton), each
kernel beside its torch reference and a check that compares them; host_copy.py, which serves either
device, sits here."""
