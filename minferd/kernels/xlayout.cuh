// Where the mat-vec kernels' int8 x (xquant.cuh) keeps each 32-element block: within every whole
// group of 8 blocks (one K-quant super-block) the even blocks first, then the odd ones
// ([0 2 4 6 1 3 5 7]); a last group of fewer than 8 in order. Why: a Q4_K / Q5_K unit reads x
// blocks 2c and 2c + 1 and a Q6_K / Q2_K / Q3_K unit blocks j and 4 + j, so in block order the
// 16- and 8-byte x loads of one block's lanes touched two 128-byte lines an instruction; stored
// this way they touch one, and x is most of the mat-vecs' L1 traffic (the 7B's decode mat-vecs
// 3.8% faster on the H100, Q6_K's up to 5%: bench/results/s42). The writer (quantize_block32)
// and every reader go through these functions; quantize_ref.quantize_x_ref is the host twin.
#pragma once

// Position of block i (0..7) of a whole group, and the block at position p (its inverse; of any
// p, its low 3 bits).
__device__ __forceinline__ int xq_pos8(int i) { return (i & 1) ? 4 + (i >> 1) : (i >> 1); }
__device__ __forceinline__ int xq_at8(int p) { return ((p & 3) << 1) | ((p >> 2) & 1); }

// Position of block kb of a row of nkb blocks.
__device__ __forceinline__ int xq_block_pos(int kb, int nkb) {
  const int g = kb & ~7;
  return g + 8 <= nkb ? g + xq_pos8(kb & 7) : kb;
}

// Block at position p of a row of nkb blocks (xq_block_pos's inverse). Q8_0's lanes walk x in
// stored order and fetch the weight block found here: walked in block order a quarter-warp's
// 16-byte x loads read two lines, not one (mmvq_rows).
__device__ __forceinline__ int xq_block_at(int p, int nkb) {
  const int g = p & ~7;
  return g + 8 <= nkb ? g + xq_at8(p) : p;  // xq_at8 reads p's low 3 bits only
}
