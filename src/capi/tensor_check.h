// Generic DLTensor checks. Each returns KF_SUCCESS or sets the thread's message (naming the
// argument, what was expected and what came) and returns KF_ERROR_INVALID_ARGUMENT.
//
// Conventions: NULL strides mean compact row-major; the stride of a dimension of size 1 is never
// used (frameworks put anything there), so checks skip it and stride_of() reports 0 for it.
#pragma once

#include <cstdint>
#include <string>

#include "kernelflow/kernelflow.h"

namespace kf::capi {

constexpr DLDataType kDtBF16{kDLBfloat, 16, 1};
constexpr DLDataType kDtF16{kDLFloat, 16, 1};
constexpr DLDataType kDtF32{kDLFloat, 32, 1};
constexpr DLDataType kDtI32{kDLInt, 32, 1};
constexpr DLDataType kDtI64{kDLInt, 64, 1};
constexpr DLDataType kDtU8{kDLUInt, 8, 1};

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
std::string dtype_name(DLDataType t);
std::string shape_string(const DLTensor* t);
std::string device_string(DLDevice d);

int64_t numel(const DLTensor* t);
int64_t bytes_of(const DLTensor* t);  // numel * element size
// Element stride of `axis` as given (compact when strides is NULL).
int64_t raw_stride(const DLTensor* t, int axis);
// The stride a kernel uses: 0 for a dimension of size 1, else raw_stride.
int64_t stride_of(const DLTensor* t, int axis);
uintptr_t data_address(const DLTensor* t);  // data + byte_offset

// Tensor present and well-formed: shape given, no negative sizes, data non-NULL when it has
// elements, one lane, no negative strides.
kf_status check_present(const DLTensor* t, const char* name);
kf_status check_dtype(const DLTensor* t, const char* name, DLDataType want);
kf_status check_dtype(const DLTensor* t, const char* name, DLDataType a, DLDataType b);
// ndim, with the expected layout in the message ("[b, s_q, h_q, 576]").
kf_status check_ndim(const DLTensor* t, const char* name, int ndim, const char* layout);
kf_status check_dim(const DLTensor* t, const char* name, int axis, int64_t want, const char* what);
kf_status check_dim_range(const DLTensor* t, const char* name, int axis, int64_t lo, int64_t hi,
                          const char* what);
kf_status check_last_contiguous(const DLTensor* t, const char* name);
kf_status check_compact(const DLTensor* t, const char* name);
// stride[axis] a multiple of `multiple` elements (skipped for a dimension of size 1).
kf_status check_stride_multiple(const DLTensor* t, const char* name, int axis, int64_t multiple,
                                const char* why);
// No two elements share an address (written tensors): sorted by stride, each dimension steps
// over the whole extent of the smaller ones.
kf_status check_no_overlap(const DLTensor* t, const char* name);
kf_status check_alignment(const DLTensor* t, const char* name, int bytes);
// t lives on ref's device (device type, and id for CUDA).
kf_status check_same_device(const DLTensor* ref, const char* ref_name, const DLTensor* t,
                            const char* name);

}  // namespace kf::capi
