#include "capi/tensor_check.h"

#include <algorithm>
#include <cinttypes>
#include <vector>

#include "capi/error.h"

namespace kf::capi {

std::string dtype_name(DLDataType t) {
  std::string base;
  switch (t.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    default: base = "code" + std::to_string(t.code) + "_"; break;
  }
  base += std::to_string(t.bits);
  if (t.lanes != 1) base += "x" + std::to_string(t.lanes);
  return base;
}

std::string shape_string(const DLTensor* t) {
  std::string s = "[";
  for (int i = 0; i < t->ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(t->shape[i]);
  }
  return s + "]";
}

std::string device_string(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda:" + std::to_string(d.device_id);
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed:" + std::to_string(d.device_id);
    default:
      return "device_type " + std::to_string(int(d.device_type)) + ":" +
             std::to_string(d.device_id);
  }
}

int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

int64_t bytes_of(const DLTensor* t) {
  return numel(t) * ((int64_t(t->dtype.bits) * t->dtype.lanes + 7) / 8);
}

int64_t raw_stride(const DLTensor* t, int axis) {
  if (t->strides) return t->strides[axis];
  int64_t s = 1;
  for (int i = t->ndim - 1; i > axis; --i) s *= t->shape[i];
  return s;
}

int64_t stride_of(const DLTensor* t, int axis) {
  return t->shape[axis] == 1 ? 0 : raw_stride(t, axis);
}

uintptr_t data_address(const DLTensor* t) {
  return reinterpret_cast<uintptr_t>(t->data) + uintptr_t(t->byte_offset);
}

kf_status check_present(const DLTensor* t, const char* name) {
  if (t == nullptr) return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a tensor, got NULL", name);
  if (t->ndim < 0 || (t->ndim > 0 && t->shape == nullptr))
    return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a shape, got ndim %d with shape %s", name,
                t->ndim, t->shape ? "given" : "NULL");
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] < 0)
      return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected sizes >= 0, got shape %s", name,
                  shape_string(t).c_str());
  if (t->dtype.lanes != 1)
    return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected one lane per element, got dtype %s", name,
                dtype_name(t->dtype).c_str());
  if (t->data == nullptr && numel(t) > 0)
    return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected a data pointer, got NULL for shape %s",
                name, shape_string(t).c_str());
  if (t->strides)
    for (int i = 0; i < t->ndim; ++i)
      if (t->shape[i] > 1 && t->strides[i] < 0)
        return fail(KF_ERROR_INVALID_ARGUMENT,
                    "%s: expected non-negative strides, got stride[%d] = %" PRId64, name, i,
                    t->strides[i]);
  return KF_SUCCESS;
}

kf_status check_dtype(const DLTensor* t, const char* name, DLDataType want) {
  if (same_dtype(t->dtype, want)) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected dtype %s, got %s", name,
              dtype_name(want).c_str(), dtype_name(t->dtype).c_str());
}

kf_status check_dtype(const DLTensor* t, const char* name, DLDataType a, DLDataType b) {
  if (same_dtype(t->dtype, a) || same_dtype(t->dtype, b)) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected dtype %s or %s, got %s", name,
              dtype_name(a).c_str(), dtype_name(b).c_str(), dtype_name(t->dtype).c_str());
}

kf_status check_ndim(const DLTensor* t, const char* name, int ndim, const char* layout) {
  if (t->ndim == ndim) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected %d dimensions %s, got %d (shape %s)", name,
              ndim, layout, t->ndim, shape_string(t).c_str());
}

kf_status check_dim(const DLTensor* t, const char* name, int axis, int64_t want, const char* what) {
  if (t->shape[axis] == want) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "%s: expected shape[%d] (%s) = %" PRId64 ", got %" PRId64 " (shape %s)", name, axis,
              what, want, t->shape[axis], shape_string(t).c_str());
}

kf_status check_dim_range(const DLTensor* t, const char* name, int axis, int64_t lo, int64_t hi,
                          const char* what) {
  if (t->shape[axis] >= lo && t->shape[axis] <= hi) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "%s: expected shape[%d] (%s) in %" PRId64 "..%" PRId64 ", got %" PRId64
              " (shape %s)",
              name, axis, what, lo, hi, t->shape[axis], shape_string(t).c_str());
}

// A tensor with no element has no layout to check (NumPy 2 exports strides 0 for one).
static bool has_no_elements(const DLTensor* t) {
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] == 0) return true;
  return false;
}

kf_status check_last_contiguous(const DLTensor* t, const char* name) {
  const int last = t->ndim - 1;
  if (last < 0 || has_no_elements(t) || t->shape[last] <= 1 || raw_stride(t, last) == 1)
    return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "%s: expected the last dimension contiguous (stride 1), got stride %" PRId64, name,
              raw_stride(t, last));
}

kf_status check_compact(const DLTensor* t, const char* name) {
  if (has_no_elements(t)) return KF_SUCCESS;
  int64_t want = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] != 1 && raw_stride(t, i) != want)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "%s: expected a compact row-major tensor, got stride[%d] = %" PRId64
                  " where %" PRId64 " is compact (shape %s)",
                  name, i, raw_stride(t, i), want, shape_string(t).c_str());
    want *= t->shape[i];
  }
  return KF_SUCCESS;
}

kf_status check_stride_multiple(const DLTensor* t, const char* name, int axis, int64_t multiple,
                                const char* why) {
  if (t->shape[axis] <= 1 || has_no_elements(t) || raw_stride(t, axis) % multiple == 0)
    return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "%s: expected stride[%d] a multiple of %" PRId64 " elements (%s), got %" PRId64, name,
              axis, multiple, why, raw_stride(t, axis));
}

kf_status check_no_overlap(const DLTensor* t, const char* name) {
  if (has_no_elements(t)) return KF_SUCCESS;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that step
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] > 1) dims.emplace_back(raw_stride(t, i), t->shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements spanned by the smaller dims
  for (const auto& [stride, size] : dims) {
    if (stride < extent)
      return fail(KF_ERROR_INVALID_ARGUMENT,
                  "%s: expected strides that do not overlap (a written tensor), got stride %" PRId64
                  " over an inner extent of %" PRId64 " elements (shape %s)",
                  name, stride, extent, shape_string(t).c_str());
    extent = stride * size;
  }
  return KF_SUCCESS;
}

kf_status check_alignment(const DLTensor* t, const char* name, int bytes) {
  const uintptr_t a = data_address(t);
  if (a % uintptr_t(bytes) == 0) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT,
              "%s: expected data + byte_offset %d-byte aligned, got address 0x%" PRIxPTR
              " (byte_offset %" PRIu64 ")",
              name, bytes, a, uint64_t(t->byte_offset));
}

kf_status check_same_device(const DLTensor* ref, const char* ref_name, const DLTensor* t,
                            const char* name) {
  // The CPU has one memory: its device id carries no meaning, so only the type is compared.
  const bool same = t->device.device_type == ref->device.device_type &&
                    (t->device.device_type == kDLCPU || t->device.device_id == ref->device.device_id);
  if (same) return KF_SUCCESS;
  return fail(KF_ERROR_INVALID_ARGUMENT, "%s: expected device %s (the device of %s), got %s", name,
              device_string(ref->device).c_str(), ref_name, device_string(t->device).c_str());
}

}  // namespace kf::capi
