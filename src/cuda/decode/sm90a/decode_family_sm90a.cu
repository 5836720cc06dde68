// The sm_90a decode family: its wgmma kernel for 16-bit caches (mla_decode_sm90a.cuh) where
// sm90a_kernel_runs (decode_config_sm90a.h: more than 16 query rows) and its 8-bit kernel
// (mla_decode_sm90a_kv8.cuh) for FP8 and INT8 caches with bf16 q where sm90a_kv8_kernel_runs
// (large batches, or every batch with KF_SM90A_KV8) and the cache has tensor maps
// (kv_tensor_map_sm90a.h); the portable family's kernels for the rest (16-bit caches at 16 rows
// or fewer; other 8-bit calls, fp16 q; geometries without tensor maps), chosen explicitly here
// with their row tiles and blocks per SM. The 8-bit kernel runs one block per SM, the portable
// 8-bit kernel two: without the switch it runs a call only when its metadata was made for at most
// one block per SM (the batch-aware default worker count gives that), so a call made with the
// portable kernel's count keeps the portable kernel.
#include "cuda/common/device_flag.h"
#include "cuda/common/switches.h"
#include "cuda/decode/decode_family.h"
#include "cuda/decode/sm90a/decode_config_sm90a.h"
#include "cuda/decode/sm90a/kv_tensor_map_sm90a.h"
#include "cuda/decode/sm90a/mla_decode_sm90a.h"
#include "cuda/decode/sm90a/mla_decode_sm90a_traits.h"

namespace kf::cuda {
namespace {

int row_tiles(int device, int num_rows, KvFormat kv_format, int batch) {
  if (sm90a_kv8_kernel_runs(kv_format, switch_sm90a_kv8(), num_rows, batch))
    return sm90a_kv8_row_tiles(num_rows);
  if (!sm90a_kernel_runs(num_rows, kv_format))
    return kDecodeSm80.row_tiles(device, num_rows, kv_format, batch);
  return sm90a_row_tiles(num_rows);
}

// One block per SM for either kernel: the 16-bit one's shared memory (Q, two 72 KB KV slots, two
// P tiles) takes the SM's 228 KB; the 8-bit one's four 41 KB stages most of it, and its 160
// threads hold 226 registers each.
int blocks_per_sm(int device, int num_rows, KvFormat kv_format, int batch) {
  if (sm90a_kv8_kernel_runs(kv_format, switch_sm90a_kv8(), num_rows, batch)) return 1;
  if (!sm90a_kernel_runs(num_rows, kv_format))
    return kDecodeSm80.blocks_per_sm(device, num_rows, kv_format, batch);
  return 1;
}

// Whether the 8-bit kernel runs the call: the rule, and without the switch metadata made for at
// most one of its blocks per SM.
bool kv8_kernel_runs(const MlaDecodeParams& p) {
  const bool on = switch_sm90a_kv8();
  if (!sm90a_kv8_kernel_runs(p.kv_format, on, p.num_rows, p.batch)) return false;
  if (on) return true;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current_device()) !=
      cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return int64_t(p.num_workers) * sm90a_kv8_row_tiles(p.num_rows) <= sms;
}

// The wgmma kernel needs the cache's tensor map (pages of at least kMinPageSize rows, a geometry
// the driver accepts); without one the portable kernel runs the call, with the same metadata.
cudaError_t run(const MlaDecodeParams& p, cudaStream_t stream) {
  if (kv8_kernel_runs(p)) {
    Kv8TensorMaps maps;
    if (p.dtype != DType::kBF16 || !encode_kv8_tensor_maps(p, &maps))
      return kDecodeSm80.run(p, stream);
    return p.kv_format == KvFormat::kFP8E4M3 ? run_mla_decode_sm90a_kv8<kKvFmtE4M3>(p, maps, stream)
                                              : run_mla_decode_sm90a_kv8<kKvFmtInt8>(p, maps, stream);
  }
  CUtensorMap kv_map;
  if (!sm90a_kernel_runs(p.num_rows, p.kv_format) || !encode_kv_tensor_map(p, &kv_map))
    return kDecodeSm80.run(p, stream);
  const bool small_pages = p.page_size < MlaSm90aTraits::kBlockN;
  if (p.dtype == DType::kBF16)
    return small_pages ? run_mla_decode_sm90a<__nv_bfloat16, true>(p, kv_map, stream)
                       : run_mla_decode_sm90a<__nv_bfloat16, false>(p, kv_map, stream);
  return small_pages ? run_mla_decode_sm90a<__half, true>(p, kv_map, stream)
                     : run_mla_decode_sm90a<__half, false>(p, kv_map, stream);
}

bool spread_small_batch(int, int num_rows, KvFormat kv_format) {
  return sm90a_spread_small_batch(num_rows, kv_format);
}

}  // namespace

const DecodeFamily kDecodeSm90a = {row_tiles, blocks_per_sm, run, spread_small_batch};

}  // namespace kf::cuda
