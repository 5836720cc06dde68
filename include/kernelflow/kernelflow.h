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
/* The same for a call of `batch` requests (1..): where the device runs another decode kernel for
 * large batches the count is that kernel's (on sm_90 the sm_90a family's 8-bit kernel, one block
 * per SM, for FP8 / INT8 caches from about 64 requests per 16 query rows), and where a small
 * batch runs faster on fewer workers the count is that (one or two requests at 16 query rows
 * with a 16-bit cache: one block per SM); the metadata, the workspace and the decode of the call
 * must use the same count. A call made with the count of kf_mla_default_num_workers_for_format
 * runs the kernel for any batch. */
KF_API kf_status kf_mla_default_num_workers_for_batch(int device_id, int h_q, int s_q,
                                                      kf_kv_format kv_format, int batch,
                                                      int* num_workers);
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

/* ---- the skinny GEMM -------------------------------------------------------------------- */

/* The fused layer's weight-streaming GEMM as an operation of its own: out[m, n] = x[m, k]
 * weight[n, k]^T (a torch.nn.Linear weight, no bias), bf16 in and out, fp32 accumulation, for
 * 1 <= m <= KF_LINEAR_MAX_ROWS rows (the batch of a decoding step) and k a multiple of 64;
 * each tensor's rows contiguous, those of x and weight 16-byte aligned. The weight is read once at close to the
 * memory's read bandwidth; the result may differ from a dense GEMM's in the last bf16 bit (the
 * order of the fp32 sums), and a rerun gives the same bits. */

#define KF_LINEAR_MAX_ROWS 128

/* Bytes of workspace kf_linear needs for these sizes (0: none; then workspace may be NULL). The
 * workspace (any dtype, compact, 256-byte aligned, on the tensors' device) holds split-K
 * partials and arrival counters: zero-fill it once before its first use; every call leaves it
 * zero again. One call at a time per workspace. */
KF_API kf_status kf_linear_workspace_size(int m, int n, int k, size_t* bytes);
KF_API kf_status kf_linear(const DLTensor* x, const DLTensor* weight, DLTensor* out,
                           DLTensor* workspace, void* stream);

/* ---- the fused decode layer ------------------------------------------------------------- */

/* One decoding step of L MLA attention layers (DeepSeek-V2-Lite, V2, V3; docs/spec.md section 3)
 * replayed as one CUDA graph: per layer the projections as weight-streaming GEMMs, the prologue
 * (RMSNorm, RoPE, the cache write with quantize-on-write, the query row), the absorbed attention
 * and the output projection; the scheduler metadata once per step for all layers. Layer l's
 * output is layer l+1's input (the attention blocks chained: residuals, norms and MLPs belong to
 * the caller's model). On the CPU backend the same layers run in fp32 when launched. */

#define KF_LAYER_MAX_BATCH 128

typedef struct kf_layer_config {
  int hidden_size;      /* model width: 2048 (V2-Lite), 5120 (V2), 7168 (V3) */
  int num_heads;        /* query heads on this device, 1..128 (a tensor-parallel shard) */
  int q_lora_rank;      /* 0: no query compression (V2-Lite); else its rank (1536 for V2/V3) */
  int kv_lora_rank;     /* 512 (the cache's latent) */
  int qk_nope_head_dim; /* 128 */
  int qk_rope_head_dim; /* 64 (the cache's rope part) */
  int v_head_dim;       /* 128 */
  float rms_norm_eps;   /* 1e-6 for DeepSeek */
  float softmax_scale;  /* explicit: 0.114721 (V2-Lite), 0.135234 (V3) */
  kf_kv_format kv_format;
  int page_size;        /* tokens per cache page */
  int max_batch;        /* rows of the static buffers, 1..KF_LAYER_MAX_BATCH */
  int max_pages_per_seq;/* columns of block_table */
  int max_position;     /* rows of the cos/sin table */
} kf_layer_config;

/* One layer's weights, bf16, each [out_features, in_features] row-major (a torch.nn.Linear
 * weight, as checkpoints store them), and its paged cache. Heads are ordered as in the
 * checkpoint: w_q / w_q_b rows are [head][nope | rope], w_kv_b rows [head][nope (W_UK) | v (W_UV)]. */
typedef struct kf_layer_weights {
  const DLTensor* w_q;       /* [num_heads * (nope + rope), hidden]; NULL when q_lora_rank > 0 */
  const DLTensor* w_q_a;     /* [q_lora_rank, hidden]; NULL when q_lora_rank == 0 */
  const DLTensor* q_a_norm;  /* [q_lora_rank]; NULL when q_lora_rank == 0 */
  const DLTensor* w_q_b;     /* [num_heads * (nope + rope), q_lora_rank]; likewise */
  const DLTensor* w_kv_a;    /* [kv_lora_rank + rope, hidden] */
  const DLTensor* kv_a_norm; /* [kv_lora_rank] */
  const DLTensor* w_kv_b;    /* [num_heads * (nope + v), kv_lora_rank] */
  const DLTensor* w_o;       /* [hidden, num_heads * v] */
  DLTensor* kv_cache;        /* [num_pages, page_size, 576] (16-bit) or uint8 [..., 644] */
} kf_layer_weights;

/* The static buffers a graph reads and writes; the caller updates their contents between
 * replays (never their addresses). Row b < batch of each is request b. */
typedef struct kf_layer_io {
  const DLTensor* hidden;        /* bf16 [max_batch, hidden]: layer 0's input */
  DLTensor* output;              /* bf16 [max_batch, hidden]: the last layer's output */
  const DLTensor* positions;     /* int32 [max_batch]: the new token's RoPE position */
  const DLTensor* cache_seqlens; /* int32 [max_batch]: lengths after this step's append; the new
                                    row is written at position cache_seqlens[b] - 1 */
  const DLTensor* block_table;   /* int32 [max_batch, max_pages_per_seq] */
  const DLTensor* cos_sin;       /* float32 [max_position, 2, rope / 2]: cos then sin of each
                                    rotary pair (i = 0 .. 31) at each position */
  DLTensor* error_buffer;        /* optional int32[KF_ERROR_BUFFER_LEN] (bad positions, lengths,
                                    pages are clamped or skipped and flagged here) */
} kf_layer_io;

typedef struct kf_layer_graph kf_layer_graph;

/* Bytes of workspace a graph of this config needs for `batch` requests and num_workers decode
 * workers (0: the device's default); device_id -1 for the CPU backend. */
KF_API kf_status kf_layer_workspace_size(const kf_layer_config* config, int batch, int num_workers,
                                         int device_id, size_t* bytes);
/* Validate everything and build the graph of num_layers layers for the first `batch` rows of the
 * static buffers (on the tensors' device; nothing is written on failure). workspace: uint8 of at
 * least kf_layer_workspace_size bytes, on the same device, alive as long as the graph. */
KF_API kf_status kf_layer_graph_create(const kf_layer_config* config,
                                       const kf_layer_weights* layers, int num_layers,
                                       const kf_layer_io* io, int batch, int num_workers,
                                       DLTensor* workspace, kf_layer_graph** graph);
/* One step: every layer, on `stream` (CUDA), or run now (CPU). */
KF_API kf_status kf_layer_graph_launch(kf_layer_graph* graph, void* stream);
/* Kernel nodes in the CUDA graph (0 on the CPU backend). */
KF_API kf_status kf_layer_graph_kernel_nodes(const kf_layer_graph* graph, int* nodes);
KF_API void kf_layer_graph_destroy(kf_layer_graph* graph);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KERNELFLOW_KERNELFLOW_H_ */
