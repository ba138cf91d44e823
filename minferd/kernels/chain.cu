// A probe (bench/chain_probe.py), not a serving path: a decode token's mat-vecs as ONE persistent
// launch instead of a graph node each. Why ask: the one-column mat-vecs stream the 7B's 38 MB
// matrices at ~57% of the H200's copy ceiling and its 300 MB output at ~79% (bench/NOTES.md s21),
// so the loss is per launch (ramp-up, the last wave's tail, the wait on the node before), not per
// byte; a persistent kernel, as Hazy Research's single-kernel decode, has neither launches nor a
// grid-wide drain between matrices. This file measures how much of that a dependency-respecting
// chain of the same mmvq_rows gets back before anything else (norms, attention) is moved in.
//
// How: the host lays out every op's CTA-sized items in one ticket order (ops in graph order). A
// CTA takes the next ticket (one atomicAdd), and where its op depends on a group of earlier ops
// (cnt: the group's counter), waits until that group's items are all done (need), then runs the
// item exactly as mmvq's launch would have run that CTA (same mmvq_rows instance, same bx), and
// counts it done. No deadlock whatever the grid: a ticket is taken only by a running CTA, so every
// item a waiting CTA depends on (a smaller ticket) is held by a running CTA whose own
// dependencies are smaller still. mode 1: no waits (the streaming bound); mode 2: each item asks
// L2 for its rows (prefetch.global.L2) before it waits, so its weights are on the way while the
// group before it drains; mode 3: no waits, no counts, no barrier and fence around them (the bare
// loop). mode | 4: static dispatch (chain_run says why).
//
// What it showed (H100, bench/results/s42, the 7B's mat-vecs; the graph 2.04 ms, 2.14 TB/s): the
// bare loop 0.99x the graph's time (static) and 1.07x (ticket); counting each item (barrier,
// fence, atomic) 1.23x; the waits on top 1.61x; the L2 prefetch no help. So the graph's launches
// with programmatic dependent launch lose almost nothing between matrices that one launch would
// win back, and the synchronisation a real chain needs costs more than they do: the bandwidth left
// on the table is inside the mat-vec's loop, not between launches (the H200, with more HBM
// headroom, not yet measured).
//
// x here is read through the read-only path (mmvq_rows' __ldg): fine for this probe, whose inputs
// no op writes. A real decode kernel that makes x inside the launch must read it coherently.
#include "pdl.cuh"
#include "mmvq.cu"

struct ChainOp {
  const u8* W;
  float* out;
  const i8* xq;
  const float2* xds;
  i64 row_bytes;
  int nrows, nb, K, kbp;
  int kind;   // the mmvq_rows instance (chain.py's KINDS)
  int first;  // ticket of its first item; its items are [first, first + items)
  int items, per_item;  // CTAs' worth of rows, and rows an item
  int cnt;    // the counter its items add to (a group: q/k/v, gate/up)
  int wait_cnt, wait_need;  // the counter it waits on and the count that means done (wait_cnt < 0: none)
};

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <int TYPE, int NW, int KW, int R>
__device__ __forceinline__ void chain_item(const ChainOp& op, int bx) {
  mmvq_rows<TYPE, 1, NW, KW, R, 1>(op.W, op.nrows, op.out, nullptr, bx, op.row_bytes, op.nb, op.xq, op.xds, op.K,
                                   op.kbp, 1, nullptr);
}

// One item: CTA `bx` of op `op`, after (mode 0, 2) the group it reads is done; then counted
// (mode 3: neither, nor the barrier and fence around them: the bare loop of items).
__device__ __forceinline__ void chain_step(const ChainOp& op, int bx, int mode, int* __restrict__ done) {
  if (mode == 2 && op.wait_cnt >= 0) {  // this item's rows, a 128-byte line a thread in turn
    const int r0 = bx * op.per_item, r1 = min(r0 + op.per_item, op.nrows);
    const u8* p = op.W + (i64)r0 * op.row_bytes;
    const i64 bytes = (i64)max(r1 - r0, 0) * op.row_bytes;
    for (i64 b = (i64)threadIdx.x * 128; b < bytes; b += 128 * blockDim.x)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p + b));
  }
  if ((mode == 0 || mode == 2) && op.wait_cnt >= 0 && threadIdx.x == 0)
    while (ld_acquire(done + op.wait_cnt) < op.wait_need) __nanosleep(32);
  if (mode != 3) __syncthreads();
  switch (op.kind) {  // chain.py's KINDS: (type, warps, K-split warps, rows) of mmvq_shapes.CONFIGS
    case 0: chain_item<T_Q4_K, 4, 4, 2>(op, bx); break;
    case 1: chain_item<T_Q4_K, 4, 2, 2>(op, bx); break;
    case 2: chain_item<T_Q4_K, 4, 1, 4>(op, bx); break;
    case 3: chain_item<T_Q6_K, 4, 4, 1>(op, bx); break;
    case 4: chain_item<T_Q6_K, 4, 2, 2>(op, bx); break;
    case 5: chain_item<T_Q6_K, 4, 2, 4>(op, bx); break;
  }
  __syncthreads();  // also: the next item reuses the shared reduction buffer, and ticket's s_t
  if (mode != 3 && threadIdx.x == 0) {
    __threadfence();  // the CTA's outputs, seen by thread 0 through the barrier, visible before its count
    atomicAdd(done + op.cnt, 1);
  }
}

// Which CTA takes which item (mode's bit 4): a ticket (atomicAdd, then a search of the table for
// its op), or statically every grid-th item, a cursor walking the table (no atomic; chain.py
// refuses a grid larger than the device holds at once, since a CTA never started could hold an
// item that the resident ones wait on).
template <int MIN_CTAS>
__device__ __forceinline__ void chain_run(const ChainOp* __restrict__ ops, int nops, int total, int mode,
                                          int* __restrict__ ticket, int* __restrict__ done) {
  __shared__ int s_t, s_op;
  if (mode & 4) {
    int o = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x) {
      while (o + 1 < nops && ops[o + 1].first <= t) ++o;
      chain_step(ops[o], t - ops[o].first, mode & 3, done);
    }
    return;
  }
  for (;;) {
    if (threadIdx.x == 0) {
      const int t = atomicAdd(ticket, 1);
      int lo = 0, hi = nops - 1;  // the op whose items hold ticket t
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (ops[mid].first <= t) lo = mid; else hi = mid - 1;
      }
      s_t = t;
      s_op = lo;
    }
    __syncthreads();
    const int t = s_t, o = s_op;
    if (t >= total) return;
    chain_step(ops[o], t - ops[o].first, mode, done);
  }
}

// The kinds' register needs differ (Q4_K's mid shape 48 alone, Q6_K's tall 80) and one kernel takes
// the largest: chain_mmvq_8 caps it at 64 (8 CTAs an SM, as many as the 48-register launches get
// loads in flight from), chain_mmvq leaves it to the compiler.
extern "C" __global__ void __launch_bounds__(128)
chain_mmvq(const ChainOp* __restrict__ ops, int nops, int total, int mode, int* __restrict__ ticket,
           int* __restrict__ done) {
  pdl_enter();
  chain_run<1>(ops, nops, total, mode, ticket, done);
}

extern "C" __global__ void __launch_bounds__(128, 8)
chain_mmvq_8(const ChainOp* __restrict__ ops, int nops, int total, int mode, int* __restrict__ ticket,
             int* __restrict__ done) {
  pdl_enter();
  chain_run<8>(ops, nops, total, mode, ticket, done);
}

// The floor under any launch-per-group decode (chain_probe.py's "read" rows): the same groups' bytes
// only read, in a graph of one launch a group, by a kernel that does nothing else (16-byte loads,
// LOADS of them in flight a thread, many short CTAs as CUB's reductions use). Segments as mmvq's
// (CTAs [0, cta1) read W0, [cta1, cta2) W1, the rest W2; n0-n2 their 16-byte words). stream_read_early: the
// loads go out before the wait on the node before (weights, which no node writes: pdl.cuh's
// exception), so a launch's ramp hides behind the previous node's tail. The sum only keeps the
// loads alive (stored where it almost never is).
constexpr int STREAM_THREADS = 256, STREAM_LOADS = 4;
// This CTA's words of its segment into v (zeros past the segment's end).
__device__ __forceinline__ void stream_load(const uint4* W0, const uint4* W1, const uint4* W2, i64 n0, i64 n1, i64 n2,
                                            int cta1, int cta2, uint4 (&v)[STREAM_LOADS]) {
  const int seg = blockIdx.x < cta1 ? 0 : (blockIdx.x < cta2 ? 1 : 2);
  const uint4* W = seg == 0 ? W0 : (seg == 1 ? W1 : W2);
  const i64 n = seg == 0 ? n0 : (seg == 1 ? n1 : n2);
  const i64 bx = blockIdx.x - (seg == 0 ? 0 : (seg == 1 ? cta1 : cta2));
  const i64 i0 = bx * STREAM_THREADS * STREAM_LOADS + threadIdx.x;
#pragma unroll
  for (int j = 0; j < STREAM_LOADS; ++j) {
    const i64 i = i0 + (i64)j * STREAM_THREADS;
    v[j] = i < n ? ld_ahead16(W + i) : make_uint4(0, 0, 0, 0);  // coherent: the early kernel's stay above the wait
  }
}

__device__ __forceinline__ void stream_fold(const uint4 (&v)[STREAM_LOADS], u32* __restrict__ sink) {
  u32 acc = 0;
#pragma unroll
  for (int j = 0; j < STREAM_LOADS; ++j) acc += v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  if (acc == sink[0] + 1u) sink[1] = acc;  // sink[0] is 0: a store once in ~2^32 threads, every load kept
}

#define STREAM_PARAMS                                                                                           \
  const uint4 *__restrict__ W0, const uint4 *__restrict__ W1, const uint4 *__restrict__ W2, i64 n0, i64 n1, i64 n2, \
      int cta1, int cta2, u32 *__restrict__ sink

extern "C" __global__ void __launch_bounds__(STREAM_THREADS) stream_read_wait(STREAM_PARAMS) {
  pdl_enter();
  uint4 v[STREAM_LOADS];
  stream_load(W0, W1, W2, n0, n1, n2, cta1, cta2, v);
  stream_fold(v, sink);
}

// Weights only before the wait (pdl.cuh's one exception): no node writes them.
extern "C" __global__ void __launch_bounds__(STREAM_THREADS) stream_read_early(STREAM_PARAMS) {
  uint4 v[STREAM_LOADS];
  stream_load(W0, W1, W2, n0, n1, n2, cta1, cta2, v);
  pdl_enter();
  stream_fold(v, sink);
}
