// Python array -> DLTensor for the C API. An unconsumed DLPack capsule (what kernelflow's Python
// layer passes for PyTorch and CuPy arrays) is read in place, its DLTensor borrowed for the call;
// any other array comes in through nanobind's nb::ndarray (a used capsule, __dlpack__ or the
// buffer protocol). The DLTensor points into the capsule's or the nb::ndarray's shape and
// strides, so a Tensor must not outlive the call that converted it.
#pragma once

#include <dlpack/dlpack.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace kf::py {

namespace nb = nanobind;

struct Tensor {
  nb::ndarray<nb::ro> readonly;  // keeps an input's buffer alive
  nb::ndarray<> writable;        // keeps an output's buffer alive
  DLTensor dl{};
  bool present = false;

  const DLTensor* in() const { return present ? &dl : nullptr; }
  DLTensor* out() { return present ? &dl : nullptr; }
};

// `name` is the argument's name, used in the TypeError raised for something that is no array
// (or, with `writable`, a read-only one). `optional` lets None through as an absent tensor.
Tensor as_input(nb::handle obj, const char* name, bool optional = false);
Tensor as_output(nb::handle obj, const char* name, bool optional = false);

// What the C API would see for `obj`: device, dtype, shape, strides (elements), data pointer.
nb::dict describe(nb::handle obj);

}  // namespace kf::py
