// The fused decode layer's CUDA side (src/cuda/layer/) against plain CPU loops:
//  - on any machine: one GEMM stage replayed through a model of cp.async's placement, ldmatrix
//    (plain and transposed) and mma.sync m16n8k16 (the PTX fragment layouts) with the kernel's
//    index functions (gemm_layout.h) gives the plain loop's products, conflict-free; the GEMM
//    split plan fits the workspace's scratch for every GEMM of the V2-Lite and V3 layers at
//    every batch; the workspace buffers are aligned and disjoint;
//  - Gpu* (skipped without CUDA or a device): the skinny GEMM (M = 1 .. 128, both weight layouts,
//    two jobs in one launch, the heads of the absorptions, split and unsplit K; the default kernel
//    family and the portable one) against a float64 loop with bit-identical reruns; the prologue (RMSNorm, RoPE, the cache row and q_pe, the
//    query absorption in the same launch) with the 8-bit rows equal to kf_cache_append's bytes for
//    the same bf16 row and the device guards; the compressed query's RMSNorm; and the graph of two
//    layers (both model shapes, bf16 and 8-bit caches, two steps of appends) against a CPU layer.
#include <cstring>

#include "core/layer_params.h"
#include "core/layer_workspace.h"
#include "cuda/layer/gemm_layout.h"
#include "gpu_util.h"

#if KF_TESTS_WITH_CUDA
#include "core/kv_format8.h"
#include "core/quant.h"
#include "cuda/layer/layer_graph.h"
#include "cuda/layer/layer_kernels.h"
#endif

using namespace kft;

namespace {

kf::LayerDims layer_dims(int hidden, int heads, int q_lora, kf::KvFormat fmt, int page_size,
                         int max_batch, int max_pages_per_seq, int max_position) {
  kf::LayerDims d{};
  d.hidden = hidden;
  d.heads = heads;
  d.q_lora = q_lora;
  d.kv_lora = 512;
  d.nope = 128;
  d.rope = 64;
  d.v = 128;
  d.eps = 1e-6f;
  d.softmax_scale = kScaleV2Lite;
  d.kv_format = fmt;
  d.page_size = page_size;
  d.page_shift = 0;
  while ((1 << d.page_shift) < page_size) ++d.page_shift;
  d.max_batch = max_batch;
  d.max_pages_per_seq = max_pages_per_seq;
  d.max_position = max_position;
  return d;
}

// (output tiles, K) of every GEMM launch of one layer (layer_graph.cu's order).
std::vector<std::pair<int64_t, int>> layer_gemms(const kf::LayerDims& d) {
  auto tiles = [](int64_t n) { return (n + kf::kLayerGemmTileN - 1) / kf::kLayerGemmTileN; };
  std::vector<std::pair<int64_t, int>> g;
  if (d.q_lora == 0) {
    g.push_back({tiles(d.q_out()) + tiles(d.kv_a_out()), d.hidden});
  } else {
    g.push_back({tiles(d.q_lora) + tiles(d.kv_a_out()), d.hidden});
    g.push_back({tiles(d.q_out()), d.q_lora});
  }
  g.push_back({d.heads * tiles(d.kv_lora), d.nope});  // q absorption
  g.push_back({d.heads * tiles(d.v), d.kv_lora});     // o absorption
  g.push_back({tiles(d.hidden), d.o_in()});           // W_o
  return g;
}

// ---- one GEMM stage through a model of the instructions ------------------------------------

using kf::cuda::TileChunk;

// Shared memory as bf16 elements; a 16-bit value per element (small integers, exact).
using Smem = std::vector<uint16_t>;

// 8x8 matrix q of an ldmatrix.x4 whose lane l supplied row address `addr[l]` (matrix q's row r
// comes from lane 8 q + r).
uint16_t matrix_at(const Smem& s, const TileChunk (&addr)[32], int q, int r, int c,
                   int row_bytes) {
  const TileChunk a = addr[8 * q + r];
  return s[kf::cuda::gemm_swizzle(a.row, a.chunk, row_bytes) / 2 + c];
}
// Register q of lane l after ldmatrix.x4 (PTX: lane l holds row l / 4, columns 2 (l % 4) and
// 2 (l % 4) + 1 of each matrix; .trans: rows 2 (l % 4), 2 (l % 4) + 1 of column l / 4).
std::array<uint16_t, 2> ldmatrix_reg(const Smem& s, const TileChunk (&addr)[32], int lane, int q,
                                     bool trans, int row_bytes = kf::cuda::kGemmTileRowBytes) {
  const int a = lane / 4, b = 2 * (lane % 4);
  if (!trans)
    return {matrix_at(s, addr, q, a, b, row_bytes), matrix_at(s, addr, q, a, b + 1, row_bytes)};
  return {matrix_at(s, addr, q, b, a, row_bytes), matrix_at(s, addr, q, b + 1, a, row_bytes)};
}

using Regs4 = std::array<std::array<uint16_t, 2>, 4>;  // 4 registers of 2 bf16 values

// d += a b for one m16n8k16 tile from the 32 lanes' registers (PTX fragment layouts: A reg i
// holds row g + 8 (i % 2), columns 2 t + 8 (i / 2) + {0, 1}; B reg i rows 2 t + 8 i + {0, 1} of
// column g; D element e row g + 8 (e / 2), column 2 t + e % 2; g = lane / 4, t = lane % 4).
void mma_model(std::array<std::array<float, 4>, 32>& d, const std::array<Regs4, 32>& a,
               const std::array<std::array<uint16_t, 2>, 32>& b0,
               const std::array<std::array<uint16_t, 2>, 32>& b1) {
  auto A = [&](int row, int col) {
    return float(from_bf16(a[(row % 8) * 4 + (col % 8) / 2][(row / 8) + 2 * (col / 8)][col % 2]));
  };
  auto B = [&](int k, int n) {
    const auto& r = (k / 8 == 0 ? b0 : b1)[n * 4 + (k % 8) / 2];
    return float(from_bf16(r[k % 2]));
  };
  for (int lane = 0; lane < 32; ++lane)
    for (int e = 0; e < 4; ++e) {
      const int row = lane / 4 + 8 * (e / 2), col = 2 * (lane % 4) + e % 2;
      for (int k = 0; k < 16; ++k) d[lane][e] += A(row, k) * B(k, col);
    }
}

// The 8 row addresses of each matrix of an ldmatrix.x4 cover the 32 banks once.
bool conflict_free(const TileChunk (&addr)[32], int row_bytes = kf::cuda::kGemmTileRowBytes) {
  for (int q = 0; q < 4; ++q) {
    std::set<int> banks;
    for (int r = 0; r < 8; ++r) {
      const uint32_t at =
          kf::cuda::gemm_swizzle(addr[8 * q + r].row, addr[8 * q + r].chunk, row_bytes);
      for (int w = 0; w < 4; ++w) banks.insert(int((at / 4 + w) % 32));
    }
    if (banks.size() != 32) return false;
  }
  return true;
}

// A kernel's stage as the model replays it: the tiles' rows, where each warp's A fragments and
// k range are, and which output column an accumulator holds.
struct StageGeometry {
  const char* name;
  bool kn;        // the weight stored W[k][n] (rows k, read with ldmatrix.trans)
  int row_bytes;  // bytes per stored row (kGemmTileRowBytes or kGemmNarrowRowBytes)
  int w_rows;     // stored weight rows per stage
  bool narrow;    // the narrow kernel: every warp holds columns 0-15 over its own 64 k
};

TileChunk model_a_chunk(const StageGeometry& g, int warp, int lane, int ks) {
  if (g.narrow) return kf::cuda::gemm_a_chunk_narrow(warp, lane, ks);
  return g.kn ? kf::cuda::gemm_a_chunk_kn(warp, lane, ks) : kf::cuda::gemm_a_chunk_nk(warp, lane, ks);
}

// The copy loops' placement (every element of a stage written exactly once), then
// gemm_stage_mma / narrow_stage_mma for each warp through the instruction model, and the
// accumulators against the plain sums over the warp's 64 k.
void check_stage_model(const StageGeometry& g, int mt) {
  SCOPED_TRACE(std::string(g.name) + " MT " + std::to_string(mt));
  auto w_val = [](int n, int k) { return float((n * 7 + k * 3) % 11 - 5); };
  auto x_val = [](int m, int k) { return float((m * 5 + k) % 7 - 3); };
  const int row_values = g.row_bytes / 2, chunks = g.row_bytes / 16;
  Smem w_tile(size_t(g.w_rows) * row_values, 0), x_tile(size_t(8 * mt) * row_values, 0);
  std::vector<int> w_hits(w_tile.size(), 0), x_hits(x_tile.size(), 0);
  auto place = [&](Smem& tile, std::vector<int>& hits, int rows, auto val) {
    for (int i = 0; i < rows * chunks; ++i) {
      const TileChunk c = kf::cuda::gemm_copy_chunk(i, g.row_bytes);
      for (int e = 0; e < 8; ++e) {
        const size_t at = kf::cuda::gemm_swizzle(c.row, c.chunk, g.row_bytes) / 2 + e;
        tile[at] = to_bf16(val(c.row, 8 * c.chunk + e));
        ++hits[at];
      }
    }
  };
  place(w_tile, w_hits, g.w_rows,
        [&](int row, int col) { return g.kn ? w_val(col, row) : w_val(row, col); });
  place(x_tile, x_hits, 8 * mt, x_val);
  for (int h : w_hits) ASSERT_EQ(h, 1);
  for (int h : x_hits) ASSERT_EQ(h, 1);
  for (int warp = 0; warp < 4; ++warp) {
    const int k0 = g.narrow ? 64 * warp : 0;
    std::vector<std::array<std::array<float, 4>, 32>> acc(mt);
    for (auto& a : acc)
      for (auto& l : a) l.fill(0.f);
    for (int kk = 0; kk < 2; ++kk) {
      std::array<Regs4, 32> a[2];
      for (int st = 0; st < 2; ++st) {
        TileChunk addr[32];
        for (int lane = 0; lane < 32; ++lane) addr[lane] = model_a_chunk(g, warp, lane, 2 * kk + st);
        EXPECT_TRUE(conflict_free(addr, g.row_bytes));
        for (int lane = 0; lane < 32; ++lane)
          for (int q = 0; q < 4; ++q)
            a[st][lane][q] = ldmatrix_reg(w_tile, addr, lane, q, g.kn, g.row_bytes);
      }
      for (int j = 0; j < mt; ++j) {
        TileChunk addr[32];
        for (int lane = 0; lane < 32; ++lane)
          addr[lane] = kf::cuda::gemm_b_chunk(j, lane, kk, g.narrow ? 8 * warp : 0);
        EXPECT_TRUE(conflict_free(addr, g.row_bytes));
        std::array<std::array<uint16_t, 2>, 32> b[4];
        for (int lane = 0; lane < 32; ++lane)
          for (int q = 0; q < 4; ++q)
            b[q][lane] = ldmatrix_reg(x_tile, addr, lane, q, false, g.row_bytes);
        mma_model(acc[j], a[0], b[0], b[1]);
        mma_model(acc[j], a[1], b[2], b[3]);
      }
    }
    for (int j = 0; j < mt; ++j)
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 4; ++e) {
          const int m = kf::cuda::gemm_acc_row(j, lane, e);
          const int n = kf::cuda::gemm_acc_col(g.narrow ? 0 : warp, lane, e);
          float want = 0.f;
          for (int k = k0; k < k0 + 64; ++k) want += x_val(m, k) * w_val(n, k);
          ASSERT_EQ(acc[j][lane][e], want) << "warp " << warp << " j " << j << " lane " << lane << " e " << e;
        }
  }
}

TEST(LayerGemmStage, InstructionModelGivesThePlainProducts) {
  constexpr int kWide = kf::cuda::kGemmTileRowBytes, kNarrow = kf::cuda::kGemmNarrowRowBytes;
  const StageGeometry nk{"W[n][k]", false, kWide, 64, false}, kn{"W[k][n]", true, kWide, 64, false},
      narrow{"narrow W[n][k]", false, kNarrow, 16, true};
  for (int mt : {1, 2, 16}) {
    check_stage_model(nk, mt);
    check_stage_model(kn, mt);
  }
  for (int mt : {1, 2, 4}) check_stage_model(narrow, mt);
}

TEST(LayerGemmPlan, SplitsFillTheGpuWithinTheScratch) {
  const kf::LayerDims shapes[] = {
      layer_dims(2048, 16, 0, kf::KvFormat::kBF16, 64, 128, 64, 4096),     // V2-Lite
      layer_dims(7168, 128, 1536, kf::KvFormat::kBF16, 64, 128, 64, 4096),  // V3
      layer_dims(7168, 16, 1536, kf::KvFormat::kFP8E4M3, 64, 128, 64, 4096),  // V3, 16-head shard
      layer_dims(5120, 128, 1536, kf::KvFormat::kINT8, 64, 128, 64, 4096),  // V2
  };
  for (const auto& d : shapes)
    for (int batch : {1, 2, 7, 8, 9, 32, 64, 127, 128})
      for (auto [tiles, k] : layer_gemms(d)) {
        const int s = kf::layer_gemm_splits(tiles, k, batch);
        SCOPED_TRACE("hidden " + std::to_string(d.hidden) + " heads " + std::to_string(d.heads) +
                     " batch " + std::to_string(batch) + " tiles " + std::to_string(tiles) +
                     " k " + std::to_string(k));
        EXPECT_GE(s, 1);
        EXPECT_LE(s, k / kf::kLayerGemmTileK);
        // At least one block per SM of a 132-SM GPU where the K stages and the partials'
        // traffic allow it.
        const int64_t most = std::min<int64_t>(std::max(1, k / kf::kLayerGemmTileK / 2),
                                               std::max(1, k / (2 * batch)));
        EXPECT_GE(tiles * s, std::min<int64_t>(132, tiles * most));
        EXPECT_LE(int64_t(s) * batch * 4, std::max<int64_t>(int64_t(k) * 2, 4 * batch));
        if (s > 1) {
          EXPECT_LE(tiles, kf::kLayerGemmBlocks / 2);  // the counters
          EXPECT_LE(tiles * s * batch * kf::kLayerGemmTileN,
                    int64_t(kf::layer_gemm_scratch_floats(d, batch)));
        }
      }
}

TEST(LayerWorkspace, BuffersAreAlignedAndDisjoint) {
  const kf::LayerDims d = layer_dims(7168, 128, 1536, kf::KvFormat::kBF16, 64, 128, 64, 4096);
  for (int batch : {1, 5, 128})
    for (int workers : {1, 132, 264}) {
      const kf::LayerWorkspace w = kf::layer_workspace_layout(d, batch, workers);
      const std::vector<std::pair<size_t, size_t>> bufs = {
          {w.metadata, size_t(kf::metadata_size(batch, workers)) * 4},
          {w.o_accum, size_t(kf::max_pieces(batch, workers)) * d.heads * 512 * 4},
          {w.lse_accum, size_t(kf::max_pieces(batch, workers)) * d.heads * 4},
          {w.q_proj, size_t(batch) * d.q_out() * 2},
          {w.q_a, size_t(batch) * d.q_lora * 2},
          {w.kv_proj, size_t(batch) * 576 * 2},
          {w.q_attn, size_t(batch) * d.heads * 576 * 2},
          {w.o_lat, size_t(batch) * d.heads * 512 * 2},
          {w.lse, size_t(batch) * d.heads * 4},
          {w.o_heads, size_t(batch) * d.o_in() * 2},
          {w.act[0], size_t(batch) * d.hidden * 2},
          {w.act[1], size_t(batch) * d.hidden * 2},
          {w.gemm_scratch, kf::layer_gemm_scratch_floats(d, batch) * 4},
          {w.gemm_counters, size_t(kf::kLayerGemmBlocks / 2) * 4},
      };
      size_t end = 0;
      for (auto [offset, bytes] : bufs) {
        EXPECT_EQ(offset % 256, 0u);
        EXPECT_GE(offset, end);  // in order, no overlap
        end = offset + bytes;
      }
      EXPECT_GE(w.total, end);
    }
}

#if KF_TESTS_WITH_CUDA

using kf::cuda::GemmJob;
using kf::cuda::GemmLaunch;
using kf::cuda::WeightLayout;

float bf(uint16_t h) { return float(from_bf16(h)); }

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, float scale) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bf16(u(rng) * scale);
  return v;
}

// A device array of n values of T (freed on scope exit).
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    void* mem = nullptr;
    if (cudaMalloc(&mem, std::max<size_t>(n, 1) * sizeof(T)) == cudaSuccess) p_ = static_cast<T*>(mem);
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { put(h); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (p_) cudaFree(p_);
  }
  T* get() const { return p_; }
  bool ok() const { return p_ != nullptr; }
  cudaError_t put(const std::vector<T>& h) {
    return cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> read() const {
    std::vector<T> h(n_);
    if (cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) h.clear();
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// |got - want| within one bf16 rounding of want plus the fp32 accumulation's error.
bool close_bf16(float got, double want, double sum_abs, double ulps = 1.0) {
  return std::fabs(double(got) - want) <= ulps * std::ldexp(std::fabs(want), -8) + 1e-5 * sum_abs + 1e-30;
}

constexpr uint16_t kCanary16 = 0xFFFF;  // a bf16 NaN: never a result of the kernels here

// ---- the skinny GEMM ------------------------------------------------------------------------

struct GemmCase {
  int m, k;
  WeightLayout layout;
  std::vector<int> n;  // one or two jobs
  int num_z;
};

std::string gemm_name(const GemmCase& c) {
  std::string s = "m " + std::to_string(c.m) + " k " + std::to_string(c.k) +
                  (c.layout == WeightLayout::kNK ? " W[n][k]" : " W[k][n]") + " z " +
                  std::to_string(c.num_z) + " n";
  for (int n : c.n) s += " " + std::to_string(n);
  return s;
}

// One job's host data: W for every z (padded rows and gaps between heads), Y with padding.
struct HostJob {
  int n;
  int64_t ldw, w_z, ldy, y_z;
  std::vector<uint16_t> w, y;
  double wv(const GemmCase& c, int z, int n_i, int k_i) const {
    const size_t at = size_t(z * w_z) +
                      (c.layout == WeightLayout::kNK ? size_t(n_i) * ldw + k_i : size_t(k_i) * ldw + n_i);
    return from_bf16(w[at]);
  }
};

void run_gemm_case(const GemmCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(gemm_name(c));
  const int64_t x_z = c.k + 8, ldx = c.num_z * x_z + 8;
  const std::vector<uint16_t> x = random_bf16(size_t(c.m) * ldx, rng, 1.f);
  std::vector<HostJob> jobs;
  for (int n : c.n) {
    HostJob j;
    j.n = n;
    const int64_t rows = c.layout == WeightLayout::kNK ? n : c.k;
    j.ldw = (c.layout == WeightLayout::kNK ? c.k : n) + 8;
    j.w_z = rows * j.ldw + 64;
    j.w = random_bf16(size_t(c.num_z * j.w_z), rng, 1.f);
    j.y_z = n + 3;
    j.ldy = c.num_z * j.y_z + 5;
    j.y.assign(size_t(c.m) * j.ldy, kCanary16);
    jobs.push_back(std::move(j));
  }
  Dev<uint16_t> dx(x);
  std::vector<std::unique_ptr<Dev<uint16_t>>> dw, dy;
  GemmLaunch g{};
  g.num_jobs = int(jobs.size());
  g.m = c.m;
  g.k = c.k;
  Dev<float> scratch(kf::layer_gemm_scratch_floats(kf::LayerDims{}, c.m));
  Dev<int32_t> counters(std::vector<int32_t>(kf::kLayerGemmBlocks / 2, 0));
  g.scratch = scratch.get();
  g.counters = counters.get();
  for (size_t i = 0; i < jobs.size(); ++i) {
    dw.push_back(std::make_unique<Dev<uint16_t>>(jobs[i].w));
    dy.push_back(std::make_unique<Dev<uint16_t>>(jobs[i].y));
    GemmJob& j = g.job[i];
    j.w = dw[i]->get();
    j.ldw = jobs[i].ldw;
    j.w_z = jobs[i].w_z;
    j.x = dx.get();
    j.ldx = ldx;
    j.x_z = x_z;
    j.y = dy[i]->get();
    j.ldy = jobs[i].ldy;
    j.y_z = jobs[i].y_z;
    j.n_cols = jobs[i].n;
    j.num_z = c.num_z;
  }
  ASSERT_TRUE(dx.ok() && scratch.ok() && counters.ok());
  CUDA_OK(kf::cuda::launch_skinny_gemm(g, c.layout, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<std::vector<uint16_t>> first;
  for (auto& d : dy) first.push_back(d->read());
  CUDA_OK(kf::cuda::launch_skinny_gemm(g, c.layout, nullptr));  // a rerun: the same bits
  CUDA_OK(cudaDeviceSynchronize());
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(dy[i]->read(), first[i]) << "job " << i;
  for (int32_t v : counters.read()) ASSERT_EQ(v, 0) << "split counters left non-zero";

  auto expect_matches_cpu = [&](const std::vector<std::vector<uint16_t>>& ys, const char* path) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      const HostJob& j = jobs[i];
      const std::vector<uint16_t>& y = ys[i];
      int bad = 0;
      for (int m = 0; m < c.m; ++m)
        for (int64_t col = 0; col < j.ldy; ++col) {
          const int z = int(col / j.y_z), n = int(col % j.y_z);
          const uint16_t got = y[size_t(m) * j.ldy + col];
          if (z >= c.num_z || n >= j.n) {  // padding: untouched
            if (got != kCanary16 && ++bad <= 5)
              ADD_FAILURE() << path << ": wrote padding m " << m << " col " << col;
            continue;
          }
          double want = 0, sum_abs = 0;
          for (int k = 0; k < c.k; ++k) {
            const double p = from_bf16(x[size_t(m) * ldx + z * x_z + k]) * j.wv(c, z, n, k);
            want += p;
            sum_abs += std::fabs(p);
          }
          if (!close_bf16(bf(got), want, sum_abs) && ++bad <= 5)
            ADD_FAILURE() << path << ": job " << i << " m " << m << " z " << z << " n " << n
                          << ": " << bf(got) << " vs " << want;
        }
      EXPECT_EQ(bad, 0) << path << ": job " << i;
    }
  };
  expect_matches_cpu(first, "default launch");

  // A split wide launch adds its splits within clusters where the device has them. Through
  // global memory (outputs poisoned again) it must match the CPU too, and give the same bits
  // when the split is the same (at most 8 splits).
  GemmLaunch planned = g;
  ASSERT_TRUE(kf::cuda::plan_gemm(planned, c.layout));
  if (planned.narrow || planned.splits == 1) return;
  for (size_t i = 0; i < jobs.size(); ++i) CUDA_OK(dy[i]->put(jobs[i].y));
  GemmLaunch global = g;
  global.global_reduce = true;
  CUDA_OK(kf::cuda::launch_skinny_gemm(global, c.layout, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  for (int32_t v : counters.read()) ASSERT_EQ(v, 0) << "split counters left non-zero";
  std::vector<std::vector<uint16_t>> through_global;
  for (auto& d : dy) through_global.push_back(d->read());
  expect_matches_cpu(through_global, "global-memory split sum");
  if (planned.splits <= 8) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(through_global[i], first[i]) << "job " << i << ": the two split sums differ";
    }
  }
}

TEST(GpuLayerGemm, MatchesCpuLoop) {
  KF_REQUIRE_GPU();
  auto rng = test_rng(14);
  const GemmCase cases[] = {
      {1, 2048, WeightLayout::kNK, {576}, 1},          // narrow (<= 32 rows): 36 tiles
      {2, 4096, WeightLayout::kNK, {576}, 1},          // K above the narrow bound: wide, split
      {7, 2048, WeightLayout::kNK, {3072, 576}, 1},    // narrow [W_q; W_kv_a]: 228 tiles
      {3, 320, WeightLayout::kNK, {40}, 1},            // narrow: K ends inside a 256-k stage
      {64, 2048, WeightLayout::kNK, {1000, 576}, 1},   // a partial tile in each job
      {128, 1024, WeightLayout::kNK, {1000, 576}, 1},  // the largest batch
      {33, 2048, WeightLayout::kNK, {2048}, 1},        // W_o: 32 tiles, 8 splits
      {5, 128, WeightLayout::kNK, {17000}, 1},         // narrow: 1063 tiles, K below a stage
      {40, 128, WeightLayout::kNK, {17000}, 1},        // 266 tiles: no split
      {9, 512, WeightLayout::kNK, {128}, 16},          // the o absorption: 16 heads, 9..16 rows
      {128, 512, WeightLayout::kNK, {128}, 16},
      {16, 128, WeightLayout::kKN, {512}, 4},          // the q absorption: W_UK stored [k][n]
      {100, 128, WeightLayout::kKN, {512}, 16},
      {1, 64, WeightLayout::kKN, {72}, 1},             // one stage, a partial tile of [k][n]
      {2, 1536, WeightLayout::kNK, {3072}, 1},         // q_b of a q_lora model
      {32, 2048, WeightLayout::kNK, {3072, 576}, 1},   // narrow, 17..32 rows: 96 KB of stages
      {20, 2048, WeightLayout::kNK, {2048}, 1},        // narrow W_o, 20 of 32 rows
      {32, 512, WeightLayout::kNK, {128}, 16},         // narrow o absorption at 32 rows
      {33, 2048, WeightLayout::kNK, {3072, 576}, 1},   // 33 rows: the wide kernel, split
      {24, 128, WeightLayout::kKN, {512}, 16},
      {40, 2048, WeightLayout::kNK, {61}, 1},          // one tile, 16 splits (8 in a cluster), 61 columns
      {12, 4096, WeightLayout::kNK, {576}, 1},         // wide 9..16 rows (K above the narrow bound)
      {24, 7168, WeightLayout::kNK, {300}, 1},         // wide 17..32 rows, a partial tile
  };
  // Each case on the device's default family (on a 9.0 device with the sm_90a family built, the
  // W[n][k] cases run its wgmma kernel) and on the portable one.
  for (const char* family : {"", "sm80"}) {
    SCOPED_TRACE(std::string("KF_KERNEL_FAMILY=") + family);
    EnvScope scope("KF_KERNEL_FAMILY", family);
    for (const GemmCase& c : cases) run_gemm_case(c, rng);
  }
}

TEST(GpuLayerGemm, RejectsWhatTheKernelsDoNotHandle) {
  KF_REQUIRE_GPU();
  Dev<uint16_t> buf(1 << 20);
  GemmLaunch g{};
  g.num_jobs = 1;
  g.m = 4;
  g.k = 128;
  GemmJob& j = g.job[0];
  j.w = j.x = buf.get();
  j.y = buf.get();
  j.ldw = j.ldx = j.ldy = 128;
  j.n_cols = 64;
  j.num_z = 1;
  GemmLaunch bad = g;
  bad.k = 100;  // not a multiple of 64
  EXPECT_EQ(kf::cuda::launch_skinny_gemm(bad, WeightLayout::kNK, nullptr), cudaErrorInvalidValue);
  bad = g;
  bad.m = 129;
  EXPECT_EQ(kf::cuda::launch_skinny_gemm(bad, WeightLayout::kNK, nullptr), cudaErrorInvalidValue);
  bad = g;
  bad.job[0].ldw = 130;  // rows not 16-byte aligned
  EXPECT_EQ(kf::cuda::launch_skinny_gemm(bad, WeightLayout::kNK, nullptr), cudaErrorInvalidValue);
  bad = g;
  bad.job[0].n_cols = 60;  // [k][n] needs whole 8-column chunks
  EXPECT_EQ(kf::cuda::launch_skinny_gemm(bad, WeightLayout::kKN, nullptr), cudaErrorInvalidValue);
  bad = g;
  bad.m = 33;                  // the wide kernel (more than kGemmNarrowMaxM rows) ...
  bad.k = 1024;                // ... with K of 16 stages ...
  bad.job[0].ldw = bad.job[0].ldx = 1024;
  bad.job[0].n_cols = 64 * 8;  // ... over 8 tiles: split, but no scratch given
  EXPECT_EQ(kf::cuda::launch_skinny_gemm(bad, WeightLayout::kNK, nullptr), cudaErrorInvalidValue);
  CUDA_OK(cudaGetLastError());
}

// Weight-read bandwidth of the V2-Lite layer's GEMMs, each on 27 layers' distinct weights (so
// the weights come from DRAM, not L2) captured in one CUDA graph, at b = 1, 8, 32, 64: printed
// as microseconds per GEMM and GB/s of weights, the wide kernel's split launches (b 32, 64) also
// with the splits added through global memory. A measurement, run only when asked
// (KF_LAYER_GEMM_BENCH=1): it checks that every launch succeeds.
TEST(GpuLayerGemm, WeightReadBandwidthV2Lite) {
  KF_REQUIRE_GPU();
  const char* on = std::getenv("KF_LAYER_GEMM_BENCH");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "a measurement: KF_LAYER_GEMM_BENCH=1 runs it";
  constexpr int kLayers = 27, kReps = 20;
  struct Kind {
    const char* name;
    int k;
    std::vector<int> n;  // columns per job
    int num_z;           // heads
    int64_t w_rows;      // weight rows per layer (all jobs)
  };
  const Kind kinds[] = {
      {"[W_q; W_kv_a] 3648 x 2048", 2048, {3072, 576}, 1, 3648},
      {"W_o 2048 x 2048", 2048, {2048}, 1, 2048},
      {"W_UV 16 x 128 x 512", 512, {128}, 16, 16 * 128},
  };
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  std::printf("%-28s %5s %10s %10s\n", "GEMM (27 distinct weights)", "b", "us/GEMM", "GB/s");
  for (const Kind& kind : kinds) {
    const size_t w_elems = size_t(kind.w_rows) * kind.k;
    Dev<uint16_t> w(w_elems * kLayers);
    ASSERT_TRUE(w.ok());
    CUDA_OK(cudaMemset(w.get(), 0x3c, w_elems * kLayers * 2));  // bf16 0.0115
    // b 1, 8 (the narrow kernel, no split), then b 32 and 64 with each way of adding splits.
    const struct {
      int m;
      bool global;
    } runs[] = {{1, false}, {8, false}, {32, false}, {32, true}, {64, false}, {64, true}};
    for (const auto& run : runs) {
      const int m = run.m;
      const bool global = run.global;
      Dev<uint16_t> x(size_t(m) * kind.k * kind.num_z), y(size_t(m) * 4096 * kind.num_z);
      Dev<float> scratch(kf::layer_gemm_scratch_floats(kf::LayerDims{}, m));
      Dev<int32_t> counters(std::vector<int32_t>(kf::kLayerGemmBlocks / 2, 0));
      CUDA_OK(cudaMemset(x.get(), 0x3c, size_t(m) * kind.k * kind.num_z * 2));
      cudaGraph_t graph;
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      cudaError_t launched = cudaSuccess;
      for (int l = 0; l < kLayers && launched == cudaSuccess; ++l) {
        GemmLaunch g{};
        g.m = m;
        g.k = kind.k;
        g.scratch = scratch.get();
        g.counters = counters.get();
        g.global_reduce = global;
        g.num_jobs = int(kind.n.size());
        const uint16_t* wl = w.get() + l * w_elems;
        int64_t col = 0;
        for (size_t j = 0; j < kind.n.size(); ++j) {
          GemmJob& job = g.job[j];
          job.w = wl + col * kind.k;
          job.ldw = kind.k;
          job.w_z = int64_t(kind.n[j]) * kind.k;
          job.x = x.get();
          job.ldx = int64_t(kind.k) * kind.num_z;
          job.x_z = kind.k;
          job.y = y.get() + col;
          job.ldy = 4096 * kind.num_z;
          job.y_z = kind.n[j];
          job.n_cols = kind.n[j];
          job.num_z = kind.num_z;
          col += kind.n[j];
        }
        launched = kf::cuda::launch_skinny_gemm(g, WeightLayout::kNK, stream);
      }
      CUDA_OK(cudaStreamEndCapture(stream, &graph));
      ASSERT_EQ(launched, cudaSuccess);
      cudaGraphExec_t exec;
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int r = 0; r < 3; ++r) CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaEventRecord(e0, stream));
      for (int r = 0; r < kReps; ++r) CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaEventRecord(e1, stream));
      CUDA_OK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = 1e3 * ms / (kReps * kLayers);
      std::printf("%-28s %5d %10.2f %10.0f%s\n", kind.name, m, us, w_elems * 2 / (us * 1e3),
                  global ? "  (splits added through global memory)" : "");
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      for (int32_t v : counters.read()) ASSERT_EQ(v, 0);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
}

// ---- the prologue -----------------------------------------------------------------------------

// RoPE tables: angle(pos, i) = pos * 10000^(-i / 32), [max_position][2][32].
std::vector<float> rope_table(int max_position) {
  std::vector<float> t(size_t(max_position) * 64);
  for (int p = 0; p < max_position; ++p)
    for (int i = 0; i < 32; ++i) {
      const double a = p * std::pow(10000.0, -i / 32.0);
      t[size_t(p) * 64 + i] = float(std::cos(a));
      t[size_t(p) * 64 + 32 + i] = float(std::sin(a));
    }
  return t;
}

// The CPU prologue of one request: the cache row [c | k_pe] and the heads' q_pe (bf16 values).
struct ProloguePlan {
  std::vector<float> row;   // 576
  std::vector<float> q_pe;  // heads x 64
};
ProloguePlan cpu_prologue(const uint16_t* q, const uint16_t* kv, const std::vector<uint16_t>& norm,
                          const float* cs, int heads, int nope, float eps) {
  ProloguePlan r;
  r.row.resize(576);
  float ss = 0.f;
  for (int j = 0; j < 512; ++j) ss += bf(kv[j]) * bf(kv[j]);
  const float inv = 1.f / std::sqrt(ss / 512.f + eps);
  for (int j = 0; j < 512; ++j) r.row[j] = bf(to_bf16(bf(kv[j]) * inv * bf(norm[j])));
  auto rope = [cs](float x0, float x1, int i, float* out) {
    out[0] = bf(to_bf16(x0 * cs[i] - x1 * cs[32 + i]));
    out[1] = bf(to_bf16(x0 * cs[32 + i] + x1 * cs[i]));
  };
  for (int i = 0; i < 32; ++i) rope(bf(kv[512 + 2 * i]), bf(kv[513 + 2 * i]), i, &r.row[512 + 2 * i]);
  r.q_pe.resize(size_t(heads) * 64);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < 32; ++i) {
      const uint16_t* x = q + h * (nope + 64) + nope + 2 * i;
      rope(bf(x[0]), bf(x[1]), i, &r.q_pe[h * 64 + 2 * i]);
    }
  return r;
}

// One prologue problem: inputs on the host, a cache of any format with a page per block-table
// entry (no two requests share a slot).
struct PrologueProblem {
  int batch, heads = 4, nope = 128, page_size = 16, max_pages = 4, num_pages, max_position = 64;
  kf::KvFormat fmt = kf::KvFormat::kBF16;
  std::vector<uint16_t> q_proj, kv_proj, norm, w_kv_b;
  std::vector<float> cos_sin;
  std::vector<int32_t> positions, seqlens, block_table;

  PrologueProblem(std::mt19937_64& rng, int batch_) : batch(batch_), num_pages(batch_ * 4) {
    q_proj = random_bf16(size_t(batch) * heads * (nope + 64), rng, 2.f);
    kv_proj = random_bf16(size_t(batch) * 576, rng, 3.f);
    for (int j = 0; j < 512; ++j) kv_proj[576 + j] = to_bf16(bf(kv_proj[576 + j]) * 1e3f);
    norm = random_bf16(512, rng, 0.5f);
    for (auto& v : norm) v = to_bf16(1.f + bf(v));
    w_kv_b = random_bf16(size_t(heads) * 256 * 512, rng, 0.1f);
    cos_sin = rope_table(max_position);
    block_table.resize(size_t(batch) * max_pages);
    std::iota(block_table.begin(), block_table.end(), 0);
    std::shuffle(block_table.begin(), block_table.end(), rng);
    // The first slot, the last of a page, the first of the next page, a middle one, the last
    // slot the block table addresses; then lengths and positions spread over the range.
    const int lens[] = {1, 16, 17, 40, 64}, poss[] = {0, 15, 63, 39, 7};
    for (int b = 0; b < batch; ++b) {
      seqlens.push_back(b < 5 ? lens[b] : 1 + (b * 7) % (max_pages * page_size));
      positions.push_back(b < 5 ? poss[b] : (b * 13) % max_position);
    }
  }
  int64_t page_stride() const { return kf::is_8bit(fmt) ? int64_t(page_size) * 644 : int64_t(page_size) * 576; }
  size_t cache_bytes() const {
    return size_t(num_pages) * page_stride() * (kf::is_8bit(fmt) ? 1 : 2);
  }
};

// Runs the fused launch on p; returns q_attn and the cache bytes (cache initialized to `cache`).
struct PrologueResult {
  std::vector<uint16_t> q_attn;
  std::vector<uint8_t> cache;
  std::vector<int32_t> eb;
};
PrologueResult run_prologue(const PrologueProblem& p, const std::vector<uint8_t>& cache) {
  Dev<uint16_t> q(p.q_proj), kv(p.kv_proj), norm(p.norm), w(p.w_kv_b);
  Dev<uint16_t> q_attn(std::vector<uint16_t>(size_t(p.batch) * p.heads * 576, kCanary16));
  Dev<float> cs(p.cos_sin);
  Dev<int32_t> pos(p.positions), len(p.seqlens), bt(p.block_table);
  Dev<int32_t> eb(std::vector<int32_t>{0, -1, 0, 0});
  Dev<uint8_t> dcache(cache);
  Dev<float> scratch(kf::layer_gemm_scratch_floats(kf::LayerDims{}, p.batch));
  Dev<int32_t> counters(std::vector<int32_t>(kf::kLayerGemmBlocks / 2, 0));

  GemmLaunch g{};
  g.num_jobs = 1;
  g.m = p.batch;
  g.k = p.nope;
  g.scratch = scratch.get();
  g.counters = counters.get();
  GemmJob& j = g.job[0];
  j.w = w.get();
  j.ldw = 512;
  j.w_z = 256 * 512;
  j.x = q.get();
  j.ldx = p.heads * (p.nope + 64);
  j.x_z = p.nope + 64;
  j.y = q_attn.get();
  j.ldy = p.heads * 576;
  j.y_z = 576;
  j.n_cols = 512;
  j.num_z = p.heads;

  kf::cuda::PrologueParams pp{};
  pp.batch = p.batch;
  pp.heads = p.heads;
  pp.nope = p.nope;
  pp.eps = 1e-6f;
  pp.q_proj = q.get();
  pp.kv_proj = kv.get();
  pp.kv_a_norm = norm.get();
  pp.q_attn = q_attn.get();
  pp.positions = pos.get();
  pp.cache_seqlens = len.get();
  pp.block_table = bt.get();
  pp.block_table_stride = p.max_pages;
  pp.cos_sin = cs.get();
  pp.max_position = p.max_position;
  pp.kv_format = p.fmt;
  pp.cache = dcache.get();
  pp.page_stride = p.page_stride();
  pp.token_stride = 576;
  pp.num_pages = p.num_pages;
  pp.page_size = p.page_size;
  pp.page_shift = 0;
  while ((1 << pp.page_shift) < p.page_size) ++pp.page_shift;
  pp.max_pages_per_seq = p.max_pages;
  pp.error_buffer = eb.get();
  PrologueResult r;
  if (kf::cuda::launch_q_absorb_prologue(g, pp, nullptr) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess)
    return r;
  r.q_attn = q_attn.read();
  r.cache = dcache.read();
  r.eb = eb.read();
  return r;
}

// The slot a request's new row goes to, or -1 where the guards skip it.
int64_t prologue_slot(const PrologueProblem& p, int b) {
  const int len = p.seqlens[b];
  if (len < 1 || len > p.max_pages * p.page_size) return -1;
  const int page = p.block_table[size_t(b) * p.max_pages + (len - 1) / p.page_size];
  if (page < 0 || page >= p.num_pages) return -1;
  return int64_t(page) * p.page_size + (len - 1) % p.page_size;
}

// The bf16 rows [c | k_pe] the prologue wrote into a 16-bit cache, or skipped rows' canaries.
std::vector<uint16_t> rows_of(const PrologueProblem& p, const std::vector<uint8_t>& cache16) {
  std::vector<uint16_t> rows(size_t(p.batch) * 576, 0);
  for (int b = 0; b < p.batch; ++b) {
    const int64_t slot = prologue_slot(p, b);
    if (slot >= 0) std::memcpy(&rows[size_t(b) * 576], &cache16[size_t(slot) * 576 * 2], 576 * 2);
  }
  return rows;
}

// Checks q_attn (absorbed q_lat and roped q_pe) and the bf16 cache rows against the CPU.
void check_prologue_bf16(const PrologueProblem& p, const PrologueResult& r,
                         const std::vector<uint8_t>& before) {
  ASSERT_EQ(r.q_attn.size(), size_t(p.batch) * p.heads * 576);
  const int qh = p.nope + 64;
  std::vector<bool> written(before.size(), false);
  for (int b = 0; b < p.batch; ++b) {
    SCOPED_TRACE("request " + std::to_string(b));
    int pos = std::min(std::max(p.positions[b], 0), p.max_position - 1);
    const ProloguePlan want = cpu_prologue(&p.q_proj[size_t(b) * p.heads * qh], &p.kv_proj[size_t(b) * 576],
                                           p.norm, &p.cos_sin[size_t(pos) * 64], p.heads, p.nope, 1e-6f);
    int bad = 0;
    for (int h = 0; h < p.heads; ++h) {
      const uint16_t* got = &r.q_attn[(size_t(b) * p.heads + h) * 576];
      for (int n = 0; n < 512; ++n) {
        double ref = 0, sum_abs = 0;
        for (int k = 0; k < p.nope; ++k) {
          const double v = from_bf16(p.q_proj[size_t(b) * p.heads * qh + h * qh + k]) *
                           from_bf16(p.w_kv_b[(size_t(h) * 256 + k) * 512 + n]);
          ref += v;
          sum_abs += std::fabs(v);
        }
        if (!close_bf16(bf(got[n]), ref, sum_abs) && ++bad <= 5)
          ADD_FAILURE() << "q_lat h " << h << " n " << n << ": " << bf(got[n]) << " vs " << ref;
      }
      for (int i = 0; i < 64; ++i)
        if (!close_bf16(bf(got[512 + i]), want.q_pe[h * 64 + i], 0, 2.0) && ++bad <= 5)
          ADD_FAILURE() << "q_pe h " << h << " i " << i << ": " << bf(got[512 + i]) << " vs "
                        << want.q_pe[h * 64 + i];
    }
    EXPECT_EQ(bad, 0);
    const int64_t slot = prologue_slot(p, b);
    if (slot < 0) continue;
    const uint16_t* row = reinterpret_cast<const uint16_t*>(&r.cache[size_t(slot) * 576 * 2]);
    for (int i = 0; i < 576; ++i) {
      written[size_t(slot) * 1152 + 2 * i] = written[size_t(slot) * 1152 + 2 * i + 1] = true;
      if (!close_bf16(bf(row[i]), want.row[i], 0, 2.0) && ++bad <= 5)
        ADD_FAILURE() << "cache row value " << i << ": " << bf(row[i]) << " vs " << want.row[i];
    }
    EXPECT_EQ(bad, 0);
  }
  size_t changed = 0;
  for (size_t i = 0; i < before.size(); ++i) changed += !written[i] && r.cache[i] != before[i];
  EXPECT_EQ(changed, 0u) << "bytes outside the new rows changed";
}

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = uint8_t(byte(rng));
  return v;
}

TEST(GpuLayerPrologue, Bf16CacheRowQueryAndAbsorptionMatchCpu) {
  KF_REQUIRE_GPU();
  for (int batch : {5, 70}) {  // 70 rows: MT = 16 for the absorption
    auto rng = test_rng(batch);
    PrologueProblem p(rng, batch);
    SCOPED_TRACE("batch " + std::to_string(batch));
    const auto before = random_bytes(p.cache_bytes(), rng);
    const PrologueResult r = run_prologue(p, before);
    ASSERT_FALSE(r.cache.empty()) << "launch failed";
    EXPECT_EQ(r.eb[0], 0);
    check_prologue_bf16(p, r, before);
    const PrologueResult again = run_prologue(p, before);
    EXPECT_EQ(again.q_attn, r.q_attn);
    EXPECT_EQ(again.cache, r.cache);
  }
}

TEST(GpuLayerPrologue, EightBitRowsAreTheBytesOfCacheAppend) {
  KF_REQUIRE_GPU();
  auto rng = test_rng(8);
  PrologueProblem p(rng, 5);
  const auto before16 = random_bytes(p.cache_bytes(), rng);
  const PrologueResult r16 = run_prologue(p, before16);
  ASSERT_FALSE(r16.cache.empty()) << "launch failed";
  const std::vector<uint16_t> rows = rows_of(p, r16.cache);
  for (kf::KvFormat fmt : {kf::KvFormat::kFP8E4M3, kf::KvFormat::kINT8}) {
    SCOPED_TRACE(fmt == kf::KvFormat::kINT8 ? "int8" : "fp8");
    p.fmt = fmt;
    const auto before = random_bytes(p.cache_bytes(), rng);
    const PrologueResult r = run_prologue(p, before);
    ASSERT_FALSE(r.cache.empty()) << "launch failed";
    EXPECT_EQ(r.q_attn, r16.q_attn);
    // The CPU backend's append of the same bf16 rows into the same starting bytes.
    HostTensor kv(kBF16, {p.batch, 576}), slots(kI64, {p.batch}),
        cache(kU8, {p.num_pages, p.page_size, 644});
    std::memcpy(kv.ptr<uint16_t>(), rows.data(), rows.size() * 2);
    for (int b = 0; b < p.batch; ++b) slots.ptr<int64_t>()[b] = prologue_slot(p, b);
    std::memcpy(cache.ptr<uint8_t>(), before.data(), before.size());
    ASSERT_EQ(kf_cache_append(kv.dl(), cache.dl(),
                              fmt == kf::KvFormat::kINT8 ? KF_KV_INT8 : KF_KV_FP8_E4M3,
                              slots.dl(), nullptr, nullptr),
              KF_SUCCESS)
        << kf_last_error();
    EXPECT_EQ(r.cache, cache.snapshot());
  }
}

TEST(GpuLayerPrologue, GuardsFlagAndSkipBadValues) {
  KF_REQUIRE_GPU();
  for (kf::KvFormat fmt : {kf::KvFormat::kBF16, kf::KvFormat::kFP8E4M3}) {
    auto rng = test_rng(3);
    PrologueProblem p(rng, 5);
    p.fmt = fmt;
    p.seqlens[1] = 0;                                        // no slot: flagged, skipped
    p.seqlens[4] = p.max_pages * p.page_size + 1;            // past the block table
    p.block_table[size_t(2) * p.max_pages + 1] = p.num_pages;  // request 2's page: bad
    p.positions[3] = p.max_position + 5;                     // clamped to the last position
    const auto before = random_bytes(p.cache_bytes(), rng);
    const PrologueResult r = run_prologue(p, before);
    ASSERT_FALSE(r.cache.empty()) << "launch failed";
    EXPECT_EQ(r.eb[0], KF_DEVERR_SEQLEN_RANGE | KF_DEVERR_PAGE_RANGE);
    EXPECT_TRUE(r.eb[1] >= 1 && r.eb[1] <= 4) << r.eb[1];
    if (fmt == kf::KvFormat::kBF16) {
      check_prologue_bf16(p, r, before);  // rows 1, 2, 4 unwritten; row 3 roped at the clamp
    } else {
      size_t changed = 0;
      for (size_t i = 0; i < before.size(); ++i) changed += r.cache[i] != before[i];
      EXPECT_GT(changed, 0u);  // rows 0 and 3
      EXPECT_LE(changed, size_t(2) * 644);
    }
  }
}

TEST(GpuLayerPrologue, RmsNormRowsInPlace) {
  KF_REQUIRE_GPU();
  auto rng = test_rng(5);
  const int rows = 3, cols = 1536, ld = 1600;
  std::vector<uint16_t> x = random_bf16(size_t(rows) * ld, rng, 4.f);
  const std::vector<uint16_t> w = random_bf16(cols, rng, 1.f);
  Dev<uint16_t> dx(x), dw(w);
  CUDA_OK(kf::cuda::launch_rmsnorm_rows(dx.get(), ld, rows, cols, dw.get(), 1e-6f, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = dx.read();
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    float ss = 0.f;
    for (int c = 0; c < cols; ++c) ss += bf(x[size_t(r) * ld + c]) * bf(x[size_t(r) * ld + c]);
    const float inv = 1.f / std::sqrt(ss / cols + 1e-6f);
    for (int c = 0; c < ld; ++c) {
      const size_t at = size_t(r) * ld + c;
      if (c >= cols) {
        bad += got[at] != x[at];
        continue;
      }
      const float want = bf(x[at]) * inv * bf(w[c]);
      if (!close_bf16(bf(got[at]), want, 0) && ++bad <= 5)
        ADD_FAILURE() << "row " << r << " col " << c << ": " << bf(got[at]) << " vs " << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

// ---- the graph of layers ------------------------------------------------------------------------

// y[m][n] = bf16(sum_k x[m][k] w[n][k]) on bf16 values (as the GPU stores every intermediate).
std::vector<float> cpu_linear(const std::vector<float>& x, int rows, int in, const std::vector<uint16_t>& w,
                              int64_t w_offset, int out) {
  std::vector<float> y(size_t(rows) * out);
  for (int m = 0; m < rows; ++m)
    for (int n = 0; n < out; ++n) {
      double s = 0;
      for (int k = 0; k < in; ++k) s += double(x[size_t(m) * in + k]) * from_bf16(w[w_offset + size_t(n) * in + k]);
      y[size_t(m) * out + n] = bf(to_bf16(float(s)));
    }
  return y;
}

std::vector<float> cpu_rmsnorm(const std::vector<float>& x, int rows, int cols,
                               const std::vector<uint16_t>& w, float eps) {
  std::vector<float> y(x.size());
  for (int r = 0; r < rows; ++r) {
    float ss = 0.f;
    for (int c = 0; c < cols; ++c) ss += x[size_t(r) * cols + c] * x[size_t(r) * cols + c];
    const float inv = 1.f / std::sqrt(ss / cols + eps);
    for (int c = 0; c < cols; ++c)
      y[size_t(r) * cols + c] = bf(to_bf16(x[size_t(r) * cols + c] * inv * bf(w[c])));
  }
  return y;
}

struct HostLayer {
  std::vector<uint16_t> w_q, w_q_a, q_a_norm, w_q_b, w_kv_a, kv_a_norm, w_kv_b, w_o;
  std::vector<uint8_t> cache;  // 16-bit values or 8-bit pages, as bytes
};

// Value d (0..575) of the cache row at position t of request b, from the cache's bytes.
float cache_value(const kf::LayerDims& d, const std::vector<uint8_t>& cache, int page, int t, int i) {
  if (!kf::is_8bit(d.kv_format)) {
    uint16_t v;
    std::memcpy(&v, &cache[(size_t(page) * d.page_size + t) * 1152 + 2 * i], 2);
    return bf(v);
  }
  const size_t base = size_t(page) * d.page_size * 644;
  if (i >= 512) {
    uint16_t v;
    std::memcpy(&v, &cache[base + kf::kv8_rope_offset(d.page_size, t) + 2 * (i - 512)], 2);
    return bf(v);
  }
  float scale;
  std::memcpy(&scale, &cache[base + kf::kv8_scale_offset(d.page_size, t)], 4);
  return kf::dequant_latent_value(cache[base + kf::kv8_latent_offset(d.page_size, t) + i],
                                  d.kv_format == kf::KvFormat::kFP8E4M3, scale);
}

// The layers on the CPU, reading the attention's keys and values from the caches the GPU wrote
// (`caches`, after the step): returns the last layer's output.
std::vector<float> cpu_layers(const kf::LayerDims& d, const std::vector<HostLayer>& layers,
                              const std::vector<std::vector<uint8_t>>& caches, std::vector<float> x,
                              int batch, const std::vector<int32_t>& positions,
                              const std::vector<int32_t>& seqlens, const std::vector<int32_t>& bt,
                              const std::vector<float>& cos_sin) {
  const int H = d.heads, qh = d.q_head();
  for (size_t l = 0; l < layers.size(); ++l) {
    const HostLayer& w = layers[l];
    std::vector<float> q;
    if (d.q_lora == 0) {
      q = cpu_linear(x, batch, d.hidden, w.w_q, 0, d.q_out());
    } else {
      auto qa = cpu_rmsnorm(cpu_linear(x, batch, d.hidden, w.w_q_a, 0, d.q_lora), batch, d.q_lora,
                            w.q_a_norm, d.eps);
      q = cpu_linear(qa, batch, d.q_lora, w.w_q_b, 0, d.q_out());
    }
    const auto kv = cpu_linear(x, batch, d.hidden, w.w_kv_a, 0, 576);
    std::vector<float> o_heads(size_t(batch) * d.o_in());
    for (int b = 0; b < batch; ++b) {
      std::vector<uint16_t> q16(size_t(H) * qh), kv16(576);
      for (size_t i = 0; i < q16.size(); ++i) q16[i] = to_bf16(q[size_t(b) * d.q_out() + i]);
      for (int i = 0; i < 576; ++i) kv16[i] = to_bf16(kv[size_t(b) * 576 + i]);
      const ProloguePlan pro = cpu_prologue(q16.data(), kv16.data(), w.kv_a_norm,
                                            &cos_sin[size_t(positions[b]) * 64], H, d.nope, d.eps);
      const int len = seqlens[b];
      for (int h = 0; h < H; ++h) {
        std::vector<float> qa(576);  // [q_lat | q_pe]
        for (int n = 0; n < 512; ++n) {
          double s = 0;
          for (int k = 0; k < d.nope; ++k)
            s += double(q[size_t(b) * d.q_out() + h * qh + k]) *
                 from_bf16(w.w_kv_b[(size_t(h) * (d.nope + d.v) + k) * 512 + n]);
          qa[n] = bf(to_bf16(float(s)));
        }
        for (int i = 0; i < 64; ++i) qa[512 + i] = pro.q_pe[h * 64 + i];
        std::vector<double> score(len);
        double mx = -1e300;
        for (int t = 0; t < len; ++t) {
          const int page = bt[size_t(b) * d.max_pages_per_seq + t / d.page_size];
          double s = 0;
          for (int i = 0; i < 576; ++i) s += double(qa[i]) * cache_value(d, caches[l], page, t % d.page_size, i);
          score[t] = s * d.softmax_scale;
          mx = std::max(mx, score[t]);
        }
        double den = 0;
        for (double& s : score) den += (s = std::exp(s - mx));
        std::vector<float> o_lat(512);
        for (int j = 0; j < 512; ++j) {
          double o = 0;
          for (int t = 0; t < len; ++t)
            o += score[t] * cache_value(d, caches[l], bt[size_t(b) * d.max_pages_per_seq + t / d.page_size],
                                        t % d.page_size, j);
          o_lat[j] = bf(to_bf16(float(o / den)));
        }
        for (int i = 0; i < d.v; ++i) {
          double s = 0;
          for (int j = 0; j < 512; ++j)
            s += double(o_lat[j]) * from_bf16(w.w_kv_b[(size_t(h) * (d.nope + d.v) + d.nope + i) * 512 + j]);
          o_heads[size_t(b) * d.o_in() + h * d.v + i] = bf(to_bf16(float(s)));
        }
      }
    }
    x = cpu_linear(o_heads, batch, d.o_in(), w.w_o, 0, d.hidden);
  }
  return x;
}

double cosine_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return 1.0 - 2.0 * ab / (aa + bb);
}

void run_graph_case(int q_lora, kf::KvFormat fmt) {
  SCOPED_TRACE(std::string("q_lora ") + std::to_string(q_lora) + " format " + std::to_string(int(fmt)));
  auto rng = test_rng(100 + q_lora + int(fmt));
  const int batch = 3, layers_n = 2, num_pages = 24, num_workers = 8;
  const kf::LayerDims d = layer_dims(256, 4, q_lora, fmt, 16, 4, 8, 256);
  auto weight = [&](int out, int in) { return random_bf16(size_t(out) * in, rng, std::sqrt(3.f / in)); };
  auto norm_w = [&](int n) {
    auto v = random_bf16(n, rng, 0.2f);
    for (auto& x : v) x = to_bf16(1.f + bf(x));
    return v;
  };
  const bool q8 = kf::is_8bit(fmt);
  const size_t cache_bytes = size_t(num_pages) * d.page_size * (q8 ? 644 : 1152);
  std::vector<HostLayer> hl(layers_n);
  for (auto& w : hl) {
    if (q_lora == 0) {
      w.w_q = weight(d.q_out(), d.hidden);
    } else {
      w.w_q_a = weight(q_lora, d.hidden);
      w.q_a_norm = norm_w(q_lora);
      w.w_q_b = weight(d.q_out(), q_lora);
    }
    w.w_kv_a = weight(576, d.hidden);
    w.kv_a_norm = norm_w(512);
    w.w_kv_b = weight(d.kv_b_out(), 512);
    w.w_o = weight(d.hidden, d.o_in());
    // Earlier tokens: N(0,1)-like rows, quantized by the CPU backend for 8-bit caches.
    HostTensor rows(kBF16, {num_pages, d.page_size, 576});
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < rows.numel(); ++i) rows.ptr<uint16_t>()[i] = to_bf16(normal(rng));
    if (q8) {
      HostTensor c8(kU8, {num_pages, d.page_size, 644});
      EXPECT_EQ(kf_cache_convert(rows.dl(), c8.dl(), fmt == kf::KvFormat::kINT8 ? KF_KV_INT8 : KF_KV_FP8_E4M3,
                                 nullptr),
                KF_SUCCESS)
          << kf_last_error();
      w.cache = c8.snapshot();
    } else {
      w.cache = rows.snapshot();
    }
    ASSERT_EQ(w.cache.size(), cache_bytes);
  }
  std::vector<int32_t> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> bt(size_t(d.max_batch) * d.max_pages_per_seq, 0);
  for (int i = 0; i < batch * d.max_pages_per_seq; ++i) bt[i] = perm[i];
  std::vector<int32_t> seqlens = {37, 70, 5, 0}, positions = {36, 69, 4, 0};
  const std::vector<float> cos_sin = rope_table(d.max_position);
  const std::vector<uint16_t> hidden16 = random_bf16(size_t(d.max_batch) * d.hidden, rng, 1.f);

  // Device copies.
  std::vector<std::unique_ptr<Dev<uint16_t>>> dev_w;
  auto up = [&](const std::vector<uint16_t>& v) -> const uint16_t* {
    if (v.empty()) return nullptr;
    dev_w.push_back(std::make_unique<Dev<uint16_t>>(v));
    return dev_w.back()->get();
  };
  std::vector<std::unique_ptr<Dev<uint8_t>>> dev_cache;
  std::vector<kf::LayerWeights> lw(layers_n);
  for (int l = 0; l < layers_n; ++l) {
    kf::LayerWeights& w = lw[l];
    w = kf::LayerWeights{};
    w.w_q = up(hl[l].w_q);
    w.w_q_a = up(hl[l].w_q_a);
    w.q_a_norm = up(hl[l].q_a_norm);
    w.w_q_b = up(hl[l].w_q_b);
    w.w_kv_a = up(hl[l].w_kv_a);
    w.kv_a_norm = up(hl[l].kv_a_norm);
    w.w_kv_b = up(hl[l].w_kv_b);
    w.w_o = up(hl[l].w_o);
    w.w_q_stride = w.w_q_a_stride = d.hidden;
    w.w_q_b_stride = q_lora;
    w.w_kv_a_stride = d.hidden;
    w.w_kv_b_stride = 512;
    w.w_o_stride = d.o_in();
    dev_cache.push_back(std::make_unique<Dev<uint8_t>>(hl[l].cache));
    w.kv_cache = dev_cache.back()->get();
    w.num_pages = num_pages;
    w.kv_page_stride = q8 ? int64_t(d.page_size) * 644 : int64_t(d.page_size) * 576;
    w.kv_token_stride = q8 ? 644 : 576;
  }
  Dev<uint16_t> hidden(hidden16), output(std::vector<uint16_t>(size_t(d.max_batch) * d.hidden, kCanary16));
  Dev<int32_t> dpos(positions), dlen(seqlens), dbt(bt), eb(std::vector<int32_t>{0, -1, 0, 0});
  Dev<float> dcs(cos_sin);
  const size_t ws_bytes = kf::layer_workspace_layout(d, batch, num_workers).total;
  Dev<uint8_t> ws(ws_bytes);
  ASSERT_TRUE(ws.ok() && hidden.ok() && output.ok());

  kf::LayerGraphParams p{};
  p.dims = d;
  p.num_layers = layers_n;
  p.layers = lw.data();
  p.io.hidden = hidden.get();
  p.io.output = output.get();
  p.io.hidden_stride = p.io.output_stride = d.hidden;
  p.io.positions = dpos.get();
  p.io.cache_seqlens = dlen.get();
  p.io.block_table = dbt.get();
  p.io.block_table_stride = d.max_pages_per_seq;
  p.io.cos_sin = dcs.get();
  p.io.error_buffer = eb.get();
  p.batch = batch;
  p.num_workers = num_workers;
  p.workspace = ws.get();
  p.workspace_bytes = ws_bytes;
  kf::cuda::LayerGraph* graph = nullptr;
  CUDA_OK(kf::cuda::layer_graph_create(p, &graph));
  ASSERT_NE(graph, nullptr);
  EXPECT_EQ(kf::cuda::layer_graph_kernel_nodes(graph), 1 + layers_n * (q_lora ? 8 : 6));
  EXPECT_LE(kf::cuda::layer_graph_kernel_nodes(graph), 1 + 8 * layers_n);

  std::vector<float> x(size_t(batch) * d.hidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = bf(hidden16[i]);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step == 1) {  // the next token of every request: the caller updates the static buffers
      for (int b = 0; b < batch; ++b) {
        ++seqlens[b];
        ++positions[b];
      }
      CUDA_OK(dlen.put(seqlens));
      CUDA_OK(dpos.put(positions));
    }
    CUDA_OK(kf::cuda::layer_graph_launch(graph, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out16 = output.read();
    std::vector<std::vector<uint8_t>> caches;
    for (auto& c : dev_cache) caches.push_back(c->read());
    // A replay on the same inputs: the same bits (the new rows are rewritten identically).
    CUDA_OK(kf::cuda::layer_graph_launch(graph, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(output.read(), out16);
    for (size_t l = 0; l < dev_cache.size(); ++l) EXPECT_EQ(dev_cache[l]->read(), caches[l]);
    EXPECT_EQ(eb.read()[0], 0);

    const std::vector<float> want =
        cpu_layers(d, hl, caches, x, batch, positions, seqlens, bt, cos_sin);
    std::vector<float> got(size_t(batch) * d.hidden);
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf(out16[i]);
    const double dist = cosine_distance(got, want);
    EXPECT_LT(dist, 1e-4) << "cosine distance of the output";
    for (size_t i = size_t(batch) * d.hidden; i < out16.size(); ++i)
      ASSERT_EQ(out16[i], kCanary16) << "wrote a row past the batch";
  }

  // Bad values written into the static buffers between replays: each replay flags them in the
  // error buffer and touches no memory outside the caches, the workspace and the outputs
  // (compute-sanitizer memcheck runs this test: scripts/sanitize.sh); the cache pages outside
  // the batch's block tables keep their bytes, and a replay with the good values is clean again.
  const std::vector<int32_t> good_len = seqlens, good_pos = positions, good_bt = bt;
  std::vector<std::vector<uint8_t>> before;
  for (auto& c : dev_cache) before.push_back(c->read());
  struct Bad {
    const char* what;
    int32_t flags;
  };
  const int past_table = d.max_pages_per_seq * d.page_size + 1;
  const Bad bads[] = {{"a length past the block table", KF_DEVERR_SEQLEN_RANGE},
                      {"a negative length", KF_DEVERR_SEQLEN_RANGE},
                      {"a page outside the cache", KF_DEVERR_PAGE_RANGE},
                      {"a position past the cos/sin table", KF_DEVERR_SEQLEN_RANGE}};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(bads[i].what);
    std::vector<int32_t> len = good_len, pos = good_pos, table = good_bt;
    if (i == 0) len[1] = past_table;
    if (i == 1) len[2] = -3;
    if (i == 2) table[size_t(0) * d.max_pages_per_seq + 1] = num_pages + 7;
    if (i == 3) pos[0] = d.max_position + 5;
    CUDA_OK(dlen.put(len));
    CUDA_OK(dpos.put(pos));
    CUDA_OK(dbt.put(table));
    CUDA_OK(eb.put(std::vector<int32_t>{0, -1, 0, 0}));
    CUDA_OK(kf::cuda::layer_graph_launch(graph, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(eb.read()[0] & bads[i].flags, bads[i].flags);
    const std::vector<uint16_t> out16 = output.read();
    for (size_t e = size_t(batch) * d.hidden; e < out16.size(); ++e)
      ASSERT_EQ(out16[e], kCanary16) << "wrote a row past the batch";
    // Pages no request of the batch addresses (in the good or the bad table) are untouched.
    std::vector<bool> used(num_pages, false);
    for (int e = 0; e < batch * d.max_pages_per_seq; ++e)
      for (const int32_t page : {good_bt[e], table[e]})
        if (page >= 0 && page < num_pages) used[page] = true;
    const size_t page_bytes = cache_bytes / num_pages;
    for (size_t l = 0; l < dev_cache.size(); ++l) {
      const std::vector<uint8_t> now = dev_cache[l]->read();
      for (int pg = 0; pg < num_pages; ++pg) {
        if (used[pg]) continue;
        ASSERT_TRUE(std::equal(now.begin() + pg * page_bytes, now.begin() + (pg + 1) * page_bytes,
                               before[l].begin() + pg * page_bytes))
            << "layer " << l << " page " << pg;
      }
    }
  }
  CUDA_OK(dlen.put(good_len));
  CUDA_OK(dpos.put(good_pos));
  CUDA_OK(dbt.put(good_bt));
  CUDA_OK(eb.put(std::vector<int32_t>{0, -1, 0, 0}));
  CUDA_OK(kf::cuda::layer_graph_launch(graph, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(eb.read()[0], 0) << "a replay with the good values again";
  kf::cuda::layer_graph_destroy(graph);
}

TEST(GpuLayerGraph, TwoLayersMatchCpuLayers) {
  KF_REQUIRE_GPU();
  for (int q_lora : {0, 128})
    for (kf::KvFormat fmt : {kf::KvFormat::kBF16, kf::KvFormat::kFP8E4M3, kf::KvFormat::kINT8})
      run_graph_case(q_lora, fmt);
}

TEST(GpuLayerGraph, RejectsUnsupportedDimensions) {
  KF_REQUIRE_GPU();
  kf::LayerGraphParams p{};
  p.dims = layer_dims(200, 4, 0, kf::KvFormat::kBF16, 16, 4, 8, 256);  // hidden not a multiple of 64
  p.num_layers = 1;
  p.batch = 1;
  p.num_workers = 1;
  kf::cuda::LayerGraph* graph = reinterpret_cast<kf::cuda::LayerGraph*>(1);
  EXPECT_EQ(kf::cuda::layer_graph_create(p, &graph), cudaErrorInvalidValue);
  EXPECT_EQ(graph, nullptr);
}

#endif  // KF_TESTS_WITH_CUDA

}  // namespace
