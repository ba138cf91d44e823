// Programmatic dependent launch (sm_90+). Inside a captured graph every kernel of this folder is
// launched as a programmatic dependent of the node before it (kernels/launch.py), so it may be
// resident before that node has finished. pdl_enter() is therefore each kernel's first statement:
// it waits until the previous node has completed and its writes are visible, and only then lets
// the next node start launching. A kernel that read or wrote anything before it would race, with
// one exception: model weights, which no node of a graph writes (ops.cu's norm_w_ahead reads a
// norm's weights before it; mat-vec weights read early measured no gain, bench/NOTES.md s18, s24).
// Launched the ordinary way (eagerly, or below sm_90) both instructions are no-ops.
#pragma once

__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
