// The skinny GEMM's entry points: validate (linear_validate.h), then run the backend of the
// tensors' device (dispatch.h).
#include "capi/dispatch.h"
#include "capi/error.h"
#include "capi/linear_validate.h"
#include "capi/nvtx.h"
#include "capi/scalar_check.h"
#include "core/layer_workspace.h"

using namespace kf::capi;

extern "C" {

KF_API kf_status kf_linear_workspace_size(int m, int n, int k, size_t* bytes) {
  return guarded([&] {
    KF_CHECK(check_linear_sizes(m, n, k, "m", "n", "k"));
    KF_CHECK(check_out_pointer(bytes, "bytes"));
    *bytes = kf::linear_workspace_layout(m, n, k).total;
    return KF_SUCCESS;
  });
}

KF_API kf_status kf_linear(const DLTensor* x, const DLTensor* weight, DLTensor* out,
                           DLTensor* workspace, void* stream) {
  return guarded([&] {
    const NvtxRange range("kf_linear");
    Device dev;
    kf::LinearParams p;
    KF_CHECK(validate_linear_call(x, weight, out, workspace, &dev, &p));
    KF_CHECK(check_backend(dev));
    return run_linear(dev, p, stream);
  });
}

}  // extern "C"
