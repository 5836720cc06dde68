// The calling thread's last error message, and the helpers every entry point uses to set it.
#pragma once

#include <exception>
#include <new>

#include "kernelflow/kernelflow.h"

namespace kf::capi {

// Sets the thread's message (printf format) and returns `status`.
kf_status fail(kf_status status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void clear_last_error();
const char* last_error();

// Propagates a failed check: the check has already set the message.
#define KF_CHECK(expr)                          \
  do {                                          \
    const kf_status kf_check_s_ = (expr);       \
    if (kf_check_s_ != KF_SUCCESS) return kf_check_s_; \
  } while (0)

// Runs an entry point's body: clears the message on success and turns a C++ exception into a
// status, since none may cross the C boundary.
template <typename F>
kf_status guarded(F&& body) noexcept {
  try {
    const kf_status s = body();
    if (s == KF_SUCCESS) clear_last_error();
    return s;
  } catch (const std::bad_alloc&) {
    return fail(KF_ERROR_INTERNAL, "out of host memory");
  } catch (const std::exception& e) {
    return fail(KF_ERROR_INTERNAL, "internal error: %s", e.what());
  } catch (...) {
    return fail(KF_ERROR_INTERNAL, "internal error: unknown exception");
  }
}

}  // namespace kf::capi
