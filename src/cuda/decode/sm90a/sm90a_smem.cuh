// What the sm_90a decode kernels' views of their shared memory have in common: the 1024-aligned
// base (a generic pointer and a shared-space address) and the regions both keep at their traits'
// offsets (kTokOkOff, kPieceOff, kMaxPieces): the tiles' token masks and the piece list.
#pragma once

#include <cstdint>

#include "cuda/decode/sm80/mla_decode_pipeline.cuh"

namespace kf::cuda::sm90a {

template <class Tr>
struct SmemBase {
  uint8_t* base;
  uint32_t base_u32;
  // Bit t: token t of the tile in slot (or stage) s was copied from a valid page.
  __device__ __forceinline__ uint64_t* tok_ok(int s) const {
    return reinterpret_cast<uint64_t*>(base + Tr::kTokOkOff) + s;
  }
  __device__ __forceinline__ PieceRun* pieces() const {
    return reinterpret_cast<PieceRun*>(base + Tr::kPieceOff);
  }
  __device__ __forceinline__ int* counts() const {
    return reinterpret_cast<int*>(base + Tr::kPieceOff + Tr::kMaxPieces * sizeof(PieceRun));
  }
};

}  // namespace kf::cuda::sm90a
