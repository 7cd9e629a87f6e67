// The parallel drivers of the kernels, shared by the op files (ops.cpp, paged_attention.cpp,
// decoder_layer.cpp): one quantization, one GEMM or one attention call over all its rows, with the thread
// split and the code path chosen. Included by op files only (it needs ATen), never by a SIMD file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "paged_attention.h"
#include "qgemm.h"

namespace workbench_cpu {

// Rows [0, a.M) split over the threads (rows are independent).
void run_quantize(const QuantArgs& a, int64_t path);
// Output column tiles of a fixed size split over the threads, never K and never by M.
void run_gemm(const GemmArgs& a, int64_t path);
// Checks that every token's sequence, position and the blocks it reads exist; returns the most keys one
// token reads. `where` names the op in the errors.
int64_t check_attention_indexes(const at::Tensor& tables, const at::Tensor& sequence, const at::Tensor& positions,
                                int64_t N, int64_t block_size, int64_t window, int64_t num_blocks, const char* where);
// Every (token, KV head) item of the call, in fixed shares over the threads.
void run_attention(const AttnArgs& a, int64_t max_keys, int64_t path);

}  // namespace workbench_cpu
