// A switch read from the environment (host code): set and not starting with '0' means on.
// Test and A/B knobs only (KF_DISABLE_PDL, KF_DECODE_64_ROW_TILES); callers read it once.
#pragma once

#include <cstdlib>

namespace kf::cuda {

inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

}  // namespace kf::cuda
