// Programmatic dependent launch (sm_90+). Inside a captured graph every kernel of this folder is
// launched as a programmatic dependent of the node before it (kernels/launch.py), so it may be
// resident before that node has finished. pdl_enter() is therefore each kernel's first statement:
// it waits until the previous node has completed and its writes are visible, and only then lets
// the next node start launching. A kernel that read or wrote anything before it would race, with
// one exception: model weights, which no node of a graph writes. Such a read goes before the wait
// only as a coherent load (ld_ahead16, ld_ahead) or a prefetch: ptxas schedules griddepcontrol.wait (SASS
// ACQBULK) above every non-coherent load (__ldg, a const __restrict__ pointer's, ld.global.nc)
// whatever the source order, and keeps it below plain loads and prefetches (bench/NOTES.md s44:
// norm.cu's norm_w_ahead read through __ldg and so waited first until s45; mat-vec weights read
// early measured no gain in s18 and s24, perhaps for the same reason).
// Launched the ordinary way (eagerly, or below sm_90) both instructions are no-ops.
#pragma once

// A coherent 16-byte load of memory no node writes, which stays where it is written (above a
// pdl_enter() that follows it).
__device__ __forceinline__ uint4 ld_ahead16(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// The same for one float (a norm's weights, a lane a value).
__device__ __forceinline__ float ld_ahead(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
