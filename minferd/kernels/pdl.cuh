// Programmatic dependent launch (sm_90+). Inside a captured graph every kernel of this folder is
// launched as a programmatic dependent of the node before it (kernels/launch.py), so it may be
// resident before that node has finished. pdl_enter() is therefore each kernel's first statement:
// it waits until the previous node has completed and its writes are visible, and only then lets
// the next node start launching. A kernel that read or wrote anything before it would race.
// Launched the ordinary way (eagerly, or below sm_90) both instructions are no-ops.
#pragma once

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Weights no node of a graph writes may be read before pdl_enter(). A mat-vec's CTA asks L2 for
// its share of the matrix there: rows [r0, r1) of W, bytes [c0, c1) of each, the CTA's threads a
// 128-byte line each in turn. Resident while the node before it still runs (a norm, an
// activation: microseconds in which HBM idles), it streams them meanwhile; in any launch all its
// rows are in flight from its start, where its warps' loads ask for one step at a time. Only a
// hint: it changes no result, and every line it names holds bytes of the range (no address
// outside W's rows). (pending: weight_prefetch, backend/pending.py)
__device__ __forceinline__ void prefetch_rows_l2(const unsigned char* W, long long row_bytes, int r0, int r1,
                                                 long long c0, long long c1) {
#if defined(__CUDA_ARCH__)
  if (r0 >= r1 || c0 >= c1) return;
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int nt = blockDim.x * blockDim.y * blockDim.z;
  if (c0 == 0 && c1 == row_bytes) {  // whole rows: one contiguous range
    c1 = (long long)(r1 - r0) * row_bytes;
    r1 = r0 + 1;
  }
  const long long lines = ((c1 - c0 + 127) >> 7) + 1;  // a row's range starts anywhere in a line
  for (long long i = tid; i < (long long)(r1 - r0) * lines; i += nt) {
    const unsigned char* row = W + (long long)(r0 + i / lines) * row_bytes;
    const unsigned long long first = reinterpret_cast<unsigned long long>(row + c0) & ~127ull;
    const unsigned long long a = first + 128ull * (unsigned long long)(i % lines);
    if (a < reinterpret_cast<unsigned long long>(row + c1))
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
  }
#endif
}
