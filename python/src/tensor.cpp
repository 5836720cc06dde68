#include "tensor.h"

#include <cstring>
#include <string>

namespace kf::py {

namespace {

// NumPy cannot export ml_dtypes' bfloat16 (JAX's CPU dtype) through DLPack or the buffer
// protocol: view its bits as uint16 and label the DLTensor bfloat16 ourselves.
nb::object unwrap_numpy_bfloat16(nb::handle obj, bool* is_bf16) {
  *is_bf16 = false;
  if (std::strcmp(Py_TYPE(obj.ptr())->tp_name, "numpy.ndarray") != 0) return nb::borrow(obj);
  nb::object dtype = obj.attr("dtype");
  if (!nb::str(dtype.attr("name")).equal(nb::str("bfloat16"))) return nb::borrow(obj);
  *is_bf16 = true;
  return obj.attr("view")("uint16");
}

std::string qualified_type_name(nb::handle obj) {
  nb::handle tp = (PyObject*)Py_TYPE(obj.ptr());
  return std::string(nb::str(tp.attr("__module__")).c_str()) + "." +
         nb::str(tp.attr("__qualname__")).c_str();
}

template <typename Array>
void fill(const Array& a, bool is_bf16, Tensor* t) {
  DLTensor& dl = t->dl;
  // data() has the producer's byte_offset folded in: the C API's alignment checks then see the
  // real address.
  dl.data = const_cast<void*>(static_cast<const void*>(a.data()));
  dl.byte_offset = 0;
  dl.device.device_type = static_cast<DLDeviceType>(a.device_type());
  dl.device.device_id = a.device_id();
  dl.ndim = static_cast<int>(a.ndim());
  dl.dtype.code = a.dtype().code;
  dl.dtype.bits = a.dtype().bits;
  dl.dtype.lanes = a.dtype().lanes;
  if (is_bf16) dl.dtype.code = kDLBfloat;
  dl.shape = const_cast<int64_t*>(a.shape_ptr());
  dl.strides = const_cast<int64_t*>(a.stride_ptr());  // nanobind fills strides (in elements)
  t->present = true;
}

[[noreturn]] void raise_not_array(nb::handle obj, const char* name, bool writable) {
  std::string msg = std::string(name) + ": expected " +
                    (writable ? "a writable array" : "an array") +
                    " (NumPy, PyTorch, CuPy, JAX or any object with __dlpack__), got " +
                    qualified_type_name(obj);
  if (writable) msg += " (read-only arrays, e.g. JAX arrays, cannot receive results)";
  throw nb::type_error(msg.c_str());
}

}  // namespace

namespace {

// One conversion for inputs and outputs: they differ in the nanobind array type held (read-only
// or writable) and in what the error says.
// A DLPack capsule not yet consumed ("dltensor", as torch.utils.dlpack.to_dlpack and CuPy's
// toDlpack make them): its DLTensor is read in place. The capsule is an argument of the running
// call, so it keeps the tensor alive until the call returns and frees it afterwards; nothing is
// copied or consumed (nanobind's import would allocate a handle and take the capsule over).
bool borrow_capsule(nb::handle obj, Tensor* t) {
  PyObject* p = obj.ptr();
  if (!PyCapsule_CheckExact(p) || !PyCapsule_IsValid(p, "dltensor")) return false;
  const auto* managed = static_cast<const DLManagedTensor*>(PyCapsule_GetPointer(p, "dltensor"));
  t->dl = managed->dl_tensor;
  t->dl.data = static_cast<char*>(t->dl.data) + t->dl.byte_offset;  // as fill() does
  t->dl.byte_offset = 0;
  t->present = true;
  return true;
}

template <typename Array>
Tensor as_array(nb::handle obj, const char* name, bool optional, Array Tensor::*member,
                bool writable) {
  Tensor t;
  if (obj.is_none()) {
    if (optional) return t;
    throw nb::type_error((std::string(name) + ": expected an array, got None").c_str());
  }
  if (borrow_capsule(obj, &t)) return t;
  bool is_bf16;
  nb::object src = unwrap_numpy_bfloat16(obj, &is_bf16);
  if (!nb::try_cast(src, t.*member, /*convert=*/false)) raise_not_array(obj, name, writable);
  fill(t.*member, is_bf16, &t);
  return t;
}

}  // namespace

Tensor as_input(nb::handle obj, const char* name, bool optional) {
  return as_array(obj, name, optional, &Tensor::readonly, false);
}

Tensor as_output(nb::handle obj, const char* name, bool optional) {
  return as_array(obj, name, optional, &Tensor::writable, true);
}

nb::dict describe(nb::handle obj) {
  Tensor t = as_input(obj, "array");
  const DLTensor& dl = t.dl;
  nb::list shape, strides;
  int64_t compact = 1;  // a DLTensor without strides is compact, row-major
  for (int i = dl.ndim - 1; i >= 0; --i) {
    strides.append(dl.strides ? dl.strides[i] : compact);
    compact *= dl.shape[i];
  }
  strides.reverse();
  for (int i = 0; i < dl.ndim; ++i) shape.append(dl.shape[i]);
  nb::dict d;
  d["device_type"] = int(dl.device.device_type);
  d["device_id"] = dl.device.device_id;
  d["dtype"] = nb::make_tuple(int(dl.dtype.code), int(dl.dtype.bits), int(dl.dtype.lanes));
  d["shape"] = nb::tuple(shape);
  d["strides"] = nb::tuple(strides);
  d["data"] = reinterpret_cast<uintptr_t>(dl.data);
  return d;
}

}  // namespace kf::py
