// encode_kv_tensor_map and encode_kv8_tensor_maps: cuTensorMapEncodeTiled, reached through the
// runtime's driver entry point (no link to the driver library), looked up once.
#include "cuda/decode/sm90a/kv_tensor_map_sm90a.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "core/kv_format8.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_kv8_traits.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"

namespace kf::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                             cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f)
               : nullptr;
  }();
  return fn;
}

}  // namespace

bool encode_kv_tensor_map(const MlaDecodeParams& p, CUtensorMap* map) {
  using Tr = MlaSm90aTraits;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || p.page_size < Tr::kMinPageSize) return false;
  constexpr cuuint64_t kElemBytes = 2;
  const cuuint64_t dims[3] = {cuuint64_t(kHeadDim), cuuint64_t(p.page_size),
                              cuuint64_t(p.num_pages)};
  const cuuint64_t strides[2] = {cuuint64_t(p.kv_token_stride) * kElemBytes,
                                 cuuint64_t(p.kv_page_stride) * kElemBytes};
  const cuuint32_t box[3] = {64, cuuint32_t(p.page_size < Tr::kBlockN ? p.page_size : Tr::kBlockN),
                             1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = p.dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 3, const_cast<void*>(p.kv), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool encode_kv8_tensor_maps(const MlaDecodeParams& p, Kv8TensorMaps* maps) {
  using Tr = MlaSm90aKv8Traits;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || p.page_size < 16) return false;
  const cuuint64_t ps = cuuint64_t(p.page_size), pages = cuuint64_t(p.num_pages);
  const cuuint32_t rows = cuuint32_t(p.page_size < Tr::kBlockN ? p.page_size : Tr::kBlockN);
  const cuuint64_t page_stride = cuuint64_t(p.kv_page_stride);  // bytes for 8-bit caches
  uint8_t* kv = static_cast<uint8_t*>(const_cast<void*>(p.kv));
  const cuuint32_t ones[3] = {1, 1, 1};
  auto tiled3 = [&](CUtensorMap* m, void* base, cuuint64_t row_bytes) {
    const cuuint64_t dims[3] = {row_bytes, ps, pages};
    const cuuint64_t strides[2] = {row_bytes, page_stride};
    const cuuint32_t box[3] = {128, rows, 1};
    return encode(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, base, dims, strides, box, ones,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  if (!tiled3(&maps->latent, kv + kv8_latent_offset(p.page_size, 0), kKv8LatentBytes) ||
      !tiled3(&maps->rope, kv + kv8_rope_offset(p.page_size, 0), kKv8RopeBytes))
    return false;
  const cuuint64_t sdims[2] = {ps, pages};
  const cuuint64_t sstrides[1] = {page_stride};
  const cuuint32_t sbox[2] = {rows, 1};
  return encode(&maps->scale, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                kv + kv8_scale_offset(p.page_size, 0), sdims, sstrides, sbox, ones,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace kf::cuda
