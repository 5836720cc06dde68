// Where the skinny GEMM (skinny_gemm.cuh) puts each 16-byte chunk of a stage in shared memory
// and which chunk each lane hands to ldmatrix: host+device index functions, so a CPU test
// (cpp_tests/test_layer_gpu.cpp) replays a stage through a model of ldmatrix and mma.sync and
// checks the products against a plain loop.
//
// A stage tile of the wide kernel is rows of 64 bf16 values (128 bytes, eight 16-byte chunks);
// chunk c of row r is stored at r * 128 + 16 (c ^ (r & 7)), so the 8 rows one ldmatrix matrix
// reads at one chunk fall in 8 different bank groups. The weight tile is 64 rows n of W[n][k]
// (chunk = 8 k), or 64 rows k of W[k][n] (chunk = 8 n); the X tile is rows m (chunk = 8 k).
// The narrow kernel's rows are 256 values (512 bytes, 32 chunks) with the same swizzle of the
// chunk's low three bits: warp w reads chunks 8 w .. 8 w + 7 of every row.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace kf::cuda {

constexpr int kGemmTileRowBytes = 128;
constexpr int kGemmNarrowRowBytes = 512;

struct TileChunk {
  int row, chunk;
};

KF_HD inline uint32_t gemm_swizzle(int row, int chunk, int row_bytes = kGemmTileRowBytes) {
  return uint32_t(row * row_bytes + ((chunk ^ (row & 7)) << 4));
}

// The i-th 16-byte chunk a copy loop moves: row i / 8, chunk i % 8 (8 consecutive threads
// copy one 128-byte row of global memory); narrow rows: row i / 32, chunk i % 32.
KF_HD inline TileChunk gemm_copy_chunk(int i, int row_bytes = kGemmTileRowBytes) {
  return row_bytes == kGemmTileRowBytes ? TileChunk{i >> 3, i & 7} : TileChunk{i >> 5, i & 31};
}

// ldmatrix.x4 addresses of the A fragment (16 weight columns n of warp w x k16 step ks) for
// lane l. The four matrices are (n 0-7, k 0-7), (n 8-15, k 0-7), (n 0-7, k 8-15),
// (n 8-15, k 8-15): the mma's a0..a3.
//   W[n][k]: rows n, plain ldmatrix; lanes 0-15 give rows n at k chunk 2 ks, lanes 16-31 at 2 ks + 1.
KF_HD inline TileChunk gemm_a_chunk_nk(int warp, int lane, int ks) {
  return {warp * 16 + (lane & 15), 2 * ks + (lane >> 4)};
}
//   Narrow W[n][k]: the block's 16 rows n, warp w's k chunks from 8 w.
KF_HD inline TileChunk gemm_a_chunk_narrow(int warp, int lane, int ks) {
  return {lane & 15, 8 * warp + 2 * ks + (lane >> 4)};
}
//   W[k][n]: rows k, ldmatrix.trans; matrix q = lane / 8 is k rows 8 (q / 2) .. + 7 at n chunk
//   2 w + q % 2.
KF_HD inline TileChunk gemm_a_chunk_kn(int warp, int lane, int ks) {
  const int mat = lane >> 3;
  return {ks * 16 + (lane & 7) + 8 * (mat >> 1), 2 * warp + (mat & 1)};
}
// ldmatrix.x4 addresses of the B fragments of X rows 8 j .. 8 j + 7 over the 32 k of half kk:
// matrix q = lane / 8 is k chunk 4 kk + q: (b0, b1) of k16 step 2 kk, then of step 2 kk + 1.
// Narrow rows: warp w's chunks start at chunk0 = 8 w.
KF_HD inline TileChunk gemm_b_chunk(int j, int lane, int kk, int chunk0 = 0) {
  return {8 * j + (lane & 7), chunk0 + 4 * kk + (lane >> 3)};
}

// The output element accumulator e (0..3) of n8 tile j holds on lane l: column n of the tile
// (warp w's 16 columns: rows of the mma's D; the narrow kernel's warps all hold columns 0-15,
// warp 0's mapping) and row m of Y (D's columns).
KF_HD inline int gemm_acc_col(int warp, int lane, int e) {
  return warp * 16 + (lane >> 2) + 8 * (e >> 1);
}
KF_HD inline int gemm_acc_row(int j, int lane, int e) { return 8 * j + 2 * (lane & 3) + (e & 1); }

}  // namespace kf::cuda
