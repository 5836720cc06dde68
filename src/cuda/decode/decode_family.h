// One decode kernel family as the launcher sees it (src/cuda/decode/mla_decode_launch.cu holds
// the table from KernelFamily to these). Each family defines its entry in its own folder.
#pragma once

#include <cuda_runtime_api.h>

#include "core/params.h"

namespace kf::cuda {

struct DecodeFamily {
  // Query-row tiles (thread blocks along the row axis) for num_rows rows of a kv_format cache,
  // in a call of `batch` requests (0: not known; a family may pick its kernel by the batch).
  int (*row_tiles)(int device, int num_rows, KvFormat kv_format, int batch);
  // Decode blocks per SM that the default worker count provides for (SMs x this / row tiles):
  // as many as fit an SM at once, or fewer where the family runs such a call faster so.
  int (*blocks_per_sm)(int device, int num_rows, KvFormat kv_format, int batch);
  // Launch the decode of validated params on the current device (the pieces, not the combine).
  cudaError_t (*run)(const MlaDecodeParams& p, cudaStream_t stream);
  // Whether its kernel for the call is better served by half the workers on the even ones at
  // small batch (core/scheduler.h, MlaMetadataParams::spread).
  bool (*spread_small_batch)(int device, int num_rows, KvFormat kv_format);
};

// The portable family: src/cuda/decode/sm80/decode_family_sm80.cu.
extern const DecodeFamily kDecodeSm80;
// The sm_90a family (built when 90 is among the architectures, KF_SM90A_FAMILY):
// src/cuda/decode/sm90a/decode_family_sm90a.cu; it runs the portable kernels for the shapes its
// own kernel does not cover.
extern const DecodeFamily kDecodeSm90a;

}  // namespace kf::cuda
