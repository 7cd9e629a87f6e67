// The code paths a CPU can run and the `path` argument every op takes (-1 auto, 0 scalar, 1 AVX2,
// 2 AVX-512 VNNI). Included by the op files only (ops.cpp, paged_attention.cpp), never by a SIMD file.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

namespace workbench_cpu {

enum Path : int64_t { AUTO = -1, SCALAR = 0, AVX2 = 1, AVX512 = 2 };

inline bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
inline bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

inline int64_t resolve(int64_t path) {
  if (path == AUTO) return has_avx512() ? AVX512 : has_avx2() ? AVX2 : SCALAR;
  TORCH_CHECK_VALUE(path == SCALAR || path == AVX2 || path == AVX512,
                    "workbench cpu kernel: path ", path, " is not -1 (auto), 0 (scalar), 1 (avx2) or 2 (avx512)");
  TORCH_CHECK_VALUE(path != AVX2 || has_avx2(), "workbench cpu kernel: this CPU has no AVX2/FMA");
  TORCH_CHECK_VALUE(path != AVX512 || has_avx512(), "workbench cpu kernel: this CPU has no AVX-512 VNNI");
  return path;
}

}  // namespace workbench_cpu
