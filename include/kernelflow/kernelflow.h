/*
 * KernelFlow-ops C API: MLA decode for DeepSeek-style models.
 *
 * Plain C (C99). Tensors are DLPack `DLTensor`s owned by the caller. A call whose tensors live on
 * the CPU runs the CPU reference backend; a call whose tensors live on a CUDA device runs the CUDA
 * backend on the given stream. No call on the decode path allocates device memory or synchronizes
 * the host, so every step can be captured in a CUDA graph.
 *
 * Errors: every call returns a kf_status; on failure kf_last_error() (per host thread) holds a
 * message naming the argument, what was expected and what came.
 *
 * Shapes (row-major; strides are DLPack strides in elements; NULL strides mean compact):
 *   q              [b, s_q, h_q, 576]  bf16 or fp16, last dim contiguous
 *   kv_cache       16-bit formats: [num_pages, page_size, 576] (or [num_pages, page_size, 1, 576]),
 *                  same dtype as q, last dim contiguous, rows 16-byte aligned;
 *                  8-bit formats: uint8 [num_pages, page_size, 644], compact inside a page
 *                  (the byte map inside a page is docs/formats.md's, not per-token packing)
 *   block_table    int32 [b, max_pages_per_seq], last dim contiguous
 *   cache_seqlens  int32 [b]
 *   metadata       int32 [kf_mla_metadata_size(b, num_workers)],
 *                  made by kf_mla_metadata_for_format
 *   out            [b, s_q, h_q, 512]  dtype of q, last dim contiguous
 *   lse            float32 [b, h_q, s_q] (natural log; -inf for a row that sees no position)
 *   workspace      uint8, at least kf_mla_workspace_size(...) bytes, 256-byte aligned
 */
#ifndef KERNELFLOW_KERNELFLOW_H_
#define KERNELFLOW_KERNELFLOW_H_

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KF_BUILDING_LIBRARY) && defined(__GNUC__)
#define KF_API __attribute__((visibility("default")))
#else
#define KF_API
#endif

#define KF_VERSION_MAJOR 0
#define KF_VERSION_MINOR 1
#define KF_VERSION_PATCH 0

/* MLA geometry shared by DeepSeek-V2-Lite, V2 and V3. */
#define KF_MLA_HEAD_DIM 576 /* q and cache row: 512 latent + 64 rope */
#define KF_MLA_LATENT_DIM 512
#define KF_MLA_ROPE_DIM 64
#define KF_MLA_MAX_HEADS 128
#define KF_MLA_MAX_SQ 16
#define KF_BYTES_PER_TOKEN_8BIT 644 /* 512 x 8-bit + 64 x bf16 + fp32 scale */

typedef enum kf_status {
  KF_SUCCESS = 0,
  KF_ERROR_INVALID_ARGUMENT = 1, /* a tensor or scalar does not fit the call */
  KF_ERROR_UNSUPPORTED = 2,      /* valid, but not built or not implemented for this device */
  KF_ERROR_CUDA = 3,             /* the CUDA runtime reported an error */
  KF_ERROR_INTERNAL = 4          /* a bug: please report it */
} kf_status;

typedef enum kf_kv_format {
  KF_KV_BF16 = 0,     /* 576 bf16 values per token */
  KF_KV_FP16 = 1,     /* 576 fp16 values per token */
  KF_KV_FP8_E4M3 = 2, /* 644 bytes per token: e4m3 latent, bf16 rope, fp32 scale */
  KF_KV_INT8 = 3      /* 644 bytes per token: int8 latent, bf16 rope, fp32 scale */
} kf_kv_format;

/* Bits of the optional device error buffer (int32[KF_ERROR_BUFFER_LEN]). Kernels never access
 * memory outside the tensors they are given whatever the device-side contents are; a bad value is
 * clamped or masked, and reported here: word 0 gets the OR of the flags, word 1 the first request
 * index seen with a bad value (-1 until then), word 2 the offending value. The caller zeroes it
 * (word 1 to -1) and reads it when it likes. */
#define KF_ERROR_BUFFER_LEN 4
#define KF_DEVERR_SEQLEN_RANGE 1  /* cache_seqlens[b] < 0 or beyond what block_table addresses */
#define KF_DEVERR_PAGE_RANGE 2    /* a block_table entry in use is outside [0, num_pages) */
#define KF_DEVERR_METADATA 4      /* metadata made for another batch, head count, s_q or version */
#define KF_DEVERR_SLOT_RANGE 8    /* cache append: slot beyond the cache (negative means skip) */

/* ---- library ---------------------------------------------------------------------------- */

KF_API const char* kf_status_string(kf_status status);
/* The last error message of the calling thread ("" when the last call succeeded). */
KF_API const char* kf_last_error(void);
/* "MAJOR.MINOR.PATCH". */
KF_API const char* kf_version(void);
/* One line: version, CUDA architectures compiled in (or "cpu-only"), CUDA runtime version. */
KF_API const char* kf_build_info(void);
/* Number of CUDA devices visible (0 without a driver or GPU; never an error). */
KF_API int kf_cuda_device_count(void);

/* ---- cache formats ---------------------------------------------------------------------- */

KF_API kf_status kf_cache_bytes_per_token(kf_kv_format format, size_t* bytes);
/* Bytes of one page of page_size tokens (page_size a power of two, 1..256; 8-bit: multiple of 16). */
KF_API kf_status kf_cache_bytes_per_page(kf_kv_format format, int page_size, size_t* bytes);

/* ---- split scheduler ---------------------------------------------------------------------- */

/* Workers (thread blocks on a GPU) the scheduler splits a batch over by default for decodes
 * over a cache of kv_format: for a CUDA device (device_id >= 0) the decode blocks that fit on
 * its SMs at once divided by the number of query-row tiles (which depends on the format: 8-bit
 * caches run 16 rows per block); for the CPU (device_id = -1) a small fixed count. */
KF_API kf_status kf_mla_default_num_workers_for_format(int device_id, int h_q, int s_q,
                                                       kf_kv_format kv_format, int* num_workers);
/* int32 elements of the metadata for a batch and a worker count. */
KF_API kf_status kf_mla_metadata_size(int batch, int num_workers, size_t* num_elements);
/* Fill metadata from cache_seqlens (on the same device), on `stream` (ignored for the CPU),
 * without host synchronization, for decodes over a cache of kv_format: the format tunes the
 * split (an 8-bit piece costs more to start, so 8-bit schedules split less); metadata made for
 * one format is correct, only less balanced, with another. The metadata records batch, h_q,
 * s_q, num_workers and that cost. */
KF_API kf_status kf_mla_metadata_for_format(const DLTensor* cache_seqlens, int h_q, int s_q,
                                            int num_workers, kf_kv_format kv_format,
                                            DLTensor* metadata, void* stream);

/* ---- decode ----------------------------------------------------------------------------- */

/* Bytes of workspace a decode needs for the split partials (0 for one worker: nothing splits). */
KF_API kf_status kf_mla_workspace_size(int batch, int h_q, int s_q, int num_workers,
                                       size_t* bytes);
/* o = softmax(scale * q k^T) v over each request's cache_seqlens[b] positions (causal for s_q >
 * 1), see docs/. workspace may be NULL when its size is 0; error_buffer may be NULL. */
KF_API kf_status kf_mla_decode(const DLTensor* q, const DLTensor* kv_cache, kf_kv_format kv_format,
                               const DLTensor* block_table, const DLTensor* cache_seqlens,
                               const DLTensor* metadata, float softmax_scale, DLTensor* out,
                               DLTensor* lse, DLTensor* workspace, DLTensor* error_buffer,
                               void* stream);

/* ---- cache write ------------------------------------------------------------------------ */

/* Write n new 576-value rows kv[n, 576] (bf16/fp16) into the paged cache: row i goes to slot
 * slot_mapping[i] = page * page_size + offset (int64; negative means skip). 8-bit formats
 * quantize on the fly. error_buffer may be NULL. */
KF_API kf_status kf_cache_append(const DLTensor* kv, DLTensor* kv_cache, kf_kv_format kv_format,
                                 const DLTensor* slot_mapping, DLTensor* error_buffer,
                                 void* stream);

/* Quantize a whole 16-bit cache (bf16 or fp16, [num_pages, page_size, 576] or
 * [num_pages, page_size, 1, 576]) into an 8-bit cache uint8 [num_pages, page_size, 644] of the
 * same geometry (dst_format KF_KV_FP8_E4M3 or KF_KV_INT8, page_size a multiple of 16): every
 * slot, the bytes kf_cache_append writes for the same row. The two caches must not overlap.
 * For importing caches; no host synchronization on a CUDA device. */
KF_API kf_status kf_cache_convert(const DLTensor* src_cache, DLTensor* dst_cache,
                                  kf_kv_format dst_format, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KERNELFLOW_KERNELFLOW_H_ */
