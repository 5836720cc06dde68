#include "capi/linear_validate.h"

#include <cinttypes>
#include <utility>

#include "capi/error.h"
#include "capi/scalar_check.h"
#include "capi/tensor_check.h"
#include "core/layer_workspace.h"

namespace kf::capi {

namespace {

constexpr int kRowAlign = 16;       // bytes: the kernels load x and weight rows 16 bytes at a time
constexpr int kRowAlignElems16 = 8;  // the same in bf16 elements
constexpr int kWorkspaceAlign = 256;
constexpr int64_t kMaxLinearDim = int64_t(1) << 30;

// A bf16 matrix [rows, cols] with contiguous rows.
kf_status check_matrix(const DLTensor* t, const char* name, const char* layout) {
  KF_CHECK(check_dtype(t, name, kDtBF16));
  KF_CHECK(check_ndim(t, name, 2, layout));
  return check_last_contiguous(t, name);
}

// Rows 16-byte aligned: the kernels load x and the weight 16 bytes at a time (out is stored
// value by value).
kf_status check_aligned_rows(const DLTensor* t, const char* name) {
  KF_CHECK(check_stride_multiple(t, name, 0, kRowAlignElems16, "16-byte aligned rows"));
  return check_alignment(t, name, kRowAlign);
}

}  // namespace

kf_status check_linear_sizes(int64_t m, int64_t n, int64_t k, const char* m_name,
                             const char* n_name, const char* k_name) {
  KF_CHECK(check_range(m, 1, KF_LINEAR_MAX_ROWS, m_name));
  KF_CHECK(check_range(n, 1, kMaxLinearDim, n_name));
  KF_CHECK(check_range(k, kLayerGemmTileK, kMaxLinearDim, k_name));
  if (k % kLayerGemmTileK != 0)
    return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a multiple of %d, got %" PRId64, k_name,
                kLayerGemmTileK, k);
  return KF_SUCCESS;
}

kf_status validate_linear_call(const DLTensor* x, const DLTensor* weight, DLTensor* out,
                               DLTensor* workspace, Device* dev, LinearParams* p) {
  KF_CHECK(check_present(x, "x"));
  KF_CHECK(check_present(weight, "weight"));
  KF_CHECK(check_present(out, "out"));
  if (workspace) KF_CHECK(check_present(workspace, "workspace"));
  KF_CHECK(resolve_device(x, "x", dev));
  KF_CHECK(check_same_device(x, "x", weight, "weight"));
  KF_CHECK(check_same_device(x, "x", out, "out"));
  if (workspace) KF_CHECK(check_same_device(x, "x", workspace, "workspace"));

  KF_CHECK(check_matrix(x, "x", "[m, k]"));
  KF_CHECK(check_matrix(weight, "weight", "[n, k]"));
  KF_CHECK(check_matrix(out, "out", "[m, n]"));
  const int64_t m = x->shape[0], k = x->shape[1], n = weight->shape[0];
  KF_CHECK(check_linear_sizes(m, n, k, "x.shape[0] (m)", "weight.shape[0] (n)",
                              "x.shape[1] (k)"));
  KF_CHECK(check_dim(weight, "weight", 1, k, "k (x.shape[1])"));
  KF_CHECK(check_dim(out, "out", 0, m, "m (x.shape[0])"));
  KF_CHECK(check_dim(out, "out", 1, n, "n (weight.shape[0])"));
  KF_CHECK(check_aligned_rows(x, "x"));
  KF_CHECK(check_aligned_rows(weight, "weight"));
  KF_CHECK(check_alignment(out, "out", 2));
  KF_CHECK(check_no_overlap(out, "out"));
  // out is written while x and the weight are read by other blocks: it may share memory with
  // neither.
  const auto span = [](const DLTensor* t) {
    const uintptr_t a = data_address(t);
    const int64_t rows = t->shape[0], last = (rows - 1) * raw_stride(t, 0) + t->shape[1];
    return std::pair<uintptr_t, uintptr_t>{a, a + uintptr_t(last) * 2};
  };
  const auto ys = span(out);
  for (const auto& [t, name] : {std::pair<const DLTensor*, const char*>{x, "x"}, {weight, "weight"}}) {
    const auto s = span(t);
    if (ys.first < s.second && s.first < ys.second)
      return fail(KF_ERROR_INVALID_ARGUMENT, "out: expected memory apart from %s, got an overlap",
                  name);
  }

  const LinearWorkspace lw = linear_workspace_layout(int(m), int(n), int(k));
  const int64_t have = workspace ? bytes_of(workspace) : 0;
  if (have < int64_t(lw.total))
    return fail(KF_ERROR_INVALID_ARGUMENT,
                "workspace: expected at least %zu bytes (kf_linear_workspace_size(m=%" PRId64
                ", n=%" PRId64 ", k=%" PRId64 ")), got %s%" PRId64 " bytes",
                lw.total, m, n, k, workspace ? "" : "NULL, ", have);
  if (workspace && have > 0) {
    KF_CHECK(check_compact(workspace, "workspace"));
    KF_CHECK(check_alignment(workspace, "workspace", kWorkspaceAlign));
  }

  *p = LinearParams{};
  p->m = int(m);
  p->n = int(n);
  p->k = int(k);
  p->x = reinterpret_cast<const uint16_t*>(data_address(x));
  p->ldx = raw_stride(x, 0);
  p->w = reinterpret_cast<const uint16_t*>(data_address(weight));
  p->ldw = raw_stride(weight, 0);
  p->y = reinterpret_cast<uint16_t*>(data_address(out));
  p->ldy = raw_stride(out, 0);
  if (lw.total > 0) {
    uint8_t* base = reinterpret_cast<uint8_t*>(data_address(workspace));
    p->scratch = reinterpret_cast<float*>(base + lw.scratch);
    p->counters = reinterpret_cast<int32_t*>(base + lw.counters);
  }
  return KF_SUCCESS;
}

}  // namespace kf::capi
