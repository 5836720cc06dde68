#include "capi/error.h"

#include <cstdarg>
#include <cstdio>
#include <string>

namespace kf::capi {
namespace {
thread_local std::string t_last_error;
}

kf_status fail(kf_status status, const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  try {
    t_last_error = buf;
  } catch (...) {  // keep the status even when the message cannot be stored
  }
  return status;
}

void clear_last_error() { t_last_error.clear(); }
const char* last_error() { return t_last_error.c_str(); }

}  // namespace kf::capi
