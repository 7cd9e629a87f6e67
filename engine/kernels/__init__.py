"""Our kernels by backend: cpu/ (C++ through torch.utils.cpp_extension) and gpu/ (CuPy and Triton), each
kernel beside its torch reference and a check that compares them. What serves either device sits here:
host_copy.py, and the int4 operands and fused parts that the CPU's and CUDA's quantized modules share."""
