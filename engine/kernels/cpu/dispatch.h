// The code paths a CPU can run and the `path` argument every op takes (-1 auto, 0 scalar, 1 AVX2,
// 2 AVX-512 VNNI, 3 AMX-INT8). Included by the op files only (ops.cpp, paged_attention.cpp), never by a SIMD
// file. Only the quantized GEMM has AMX code; the other ops run their AVX-512 (or AVX2) code on that path.
#pragma once

#include <c10/util/Exception.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

namespace workbench_cpu {

enum Path : int64_t { AUTO = -1, SCALAR = 0, AVX2 = 1, AVX512 = 2, AMX = 3 };

inline bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
inline bool has_avx512() {
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

// Linux hands a process the tile unit's state only once asked (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); a tile instruction before that is a SIGILL. Asked once per process, for all threads.
inline bool has_amx() {
  static const bool granted = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return has_avx512() && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
           syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return granted;
}

inline int64_t resolve(int64_t path) {
  if (path == AUTO) return has_amx() ? AMX : has_avx512() ? AVX512 : has_avx2() ? AVX2 : SCALAR;
  TORCH_CHECK_VALUE(path >= SCALAR && path <= AMX, "workbench cpu kernel: path ", path,
                    " is not -1 (auto), 0 (scalar), 1 (avx2), 2 (avx512) or 3 (amx)");
  TORCH_CHECK_VALUE(path != AVX2 || has_avx2(), "workbench cpu kernel: this CPU has no AVX2/FMA");
  TORCH_CHECK_VALUE(path != AVX512 || has_avx512(), "workbench cpu kernel: this CPU has no AVX-512 VNNI");
  TORCH_CHECK_VALUE(path != AMX || has_amx(), "workbench cpu kernel: this CPU (or this kernel) gives no AMX-INT8");
  return path;
}

}  // namespace workbench_cpu
