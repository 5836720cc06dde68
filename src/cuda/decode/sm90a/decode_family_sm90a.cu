// The sm_90a decode family: which calls its wgmma kernel runs (mla_decode_sm90a.cuh), and the
// portable family's kernels for the rest, chosen explicitly here:
//   16-bit caches, more than 16 query rows   the sm_90a kernel (64-row tiles, one block per SM);
//   16 rows or fewer (h_q 16, s_q 1)         the portable M16 kernel: that shape is bound by the
//                                            cache read, where the portable kernel already reads
//                                            at the device's read ceiling, and a 64-row wgmma
//                                            tile would compute four times the rows;
//   8-bit caches                             the portable 8-bit kernels (no sm_90a version yet).
#include "core/mla_shape.h"
#include "cuda/decode/decode_family.h"
#include "cuda/decode/sm80/mla_decode_traits.h"
#include "cuda/decode/sm90a/mla_decode_sm90a.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"

namespace kf::cuda {
namespace {

bool sm90a_runs(int num_rows, KvFormat kv_format) {
  return !is_8bit(kv_format) && num_rows > MlaTraitsM16::kBlockM;
}

int row_tiles(int device, int num_rows, KvFormat kv_format) {
  if (!sm90a_runs(num_rows, kv_format)) return kDecodeSm80.row_tiles(device, num_rows, kv_format);
  return ceil_div(num_rows, MlaSm90aTraits::kBlockM);
}

// One block per SM: its shared memory (Q and two 72 KB KV slots) takes the SM's 228 KB.
int blocks_per_sm(int device, int num_rows, KvFormat kv_format) {
  if (!sm90a_runs(num_rows, kv_format))
    return kDecodeSm80.blocks_per_sm(device, num_rows, kv_format);
  return 1;
}

cudaError_t run(const MlaDecodeParams& p, cudaStream_t stream) {
  if (!sm90a_runs(p.num_rows, p.kv_format)) return kDecodeSm80.run(p, stream);
  return p.dtype == DType::kBF16 ? run_mla_decode_sm90a<__nv_bfloat16>(p, stream)
                                 : run_mla_decode_sm90a<__half>(p, stream);
}

}  // namespace

const DecodeFamily kDecodeSm90a = {row_tiles, blocks_per_sm, run};

}  // namespace kf::cuda
