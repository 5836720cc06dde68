// Kernel families and the rule that picks one for a device (host code with no CUDA dependency,
// so the CPU tests check the rule: cpp_tests/test_decode_config.cpp).
//
// A kernel family is a set of kernels written for one class of hardware and compiled only for
// the architectures it supports (CMakeLists.txt: one object library per family, with its own
// CUDA_ARCHITECTURES; a source's folder name says its family):
//   kSm80   the portable family: mma.sync, cp.async, ldmatrix. Every .cu file outside an
//           `sm90a/` folder. Compiled to SASS for each requested architecture (KF_CUDA_ARCHS,
//           default 80 86 89 90) and to PTX for the highest one, so a newer device (sm_100,
//           sm_120) runs it by JIT-compiling that PTX.
//   kSm90a  the Hopper family (wgmma, TMA): sources under `src/cuda/<op>/sm90a/`, compiled for
//           sm_90a only and only when 90 is requested. sm_90a code runs on compute capability
//           9.0 alone. No kernels are in it yet; the rule and the build already handle it.
// An entry point whose kernels have no version in the device's family runs the portable one
// (src/cuda/decode/mla_decode_launch.cu: the decode's table of families).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace kf::cuda {

enum class KernelFamily { kSm80, kSm90a };

// What a build compiled, from the words CMake passes in KF_CUDA_ARCHS_STRING ("80 86 89 90",
// plus "90a" when the sm_90a family has kernels): SASS for every number, PTX for the highest.
struct BuildArchs {
  std::vector<int> sass;  // compute capabilities as major * 10 + minor, ascending
  int ptx = 0;            // the PTX's compute capability (0: none)
  bool sm90a = false;     // the sm_90a family is in the build
};

inline BuildArchs parse_build_archs(const char* words) {
  BuildArchs b;
  for (const char* s = words; s != nullptr && *s != '\0';) {
    char* end = nullptr;
    const long v = std::strtol(s, &end, 10);
    if (end == s) {  // not a number ("cpu-only"): skip the word
      while (*s != '\0' && *s != ' ') ++s;
    } else if (*end == 'a') {
      b.sm90a = b.sm90a || v == 90;
      s = end + 1;
    } else {
      b.sass.push_back(int(v));
      if (v > b.ptx) b.ptx = int(v);
      s = end;
    }
    while (*s == ' ') ++s;
  }
  return b;
}

// Whether the portable family has code a device of compute capability cc (major * 10 + minor)
// can run: SASS of the same major version and a minor version at most the device's, or PTX of
// an architecture at most the device's (compiled by the driver on first use).
inline bool portable_sass_runs(int cc, const BuildArchs& built) {
  for (int s : built.sass)
    if (s / 10 == cc / 10 && s % 10 <= cc % 10) return true;
  return false;
}
inline bool portable_ptx_runs(int cc, const BuildArchs& built) {
  return built.ptx != 0 && built.ptx <= cc;
}
inline bool portable_image_runs(int cc, const BuildArchs& built) {
  return portable_sass_runs(cc, built) || portable_ptx_runs(cc, built);
}

// What KF_KERNEL_FAMILY in the environment asks for: unset, empty or "auto" the default family
// (pick_family); "sm80" the portable family everywhere; "sm90a" the sm_90a family where the
// device (9.0) and the build have it, else the portable one (the default's choice too).
enum class FamilyRequest { kAuto, kSm80, kSm90a };

inline std::optional<FamilyRequest> parse_family_request(const std::string& value) {
  if (value.empty() || value == "auto") return FamilyRequest::kAuto;
  if (value == "sm80") return FamilyRequest::kSm80;
  if (value == "sm90a") return FamilyRequest::kSm90a;
  return std::nullopt;
}


// The family a device of compute capability major.minor runs: sm90a on 9.0 when the build has
// it, unless the portable family is asked for (the default: on the H200 the sm_90a decode is at
// least as fast as the portable one at every batch of h_q 128, docs/design.md "The sm_90a
// family"); else the portable family where its code runs; none (nullopt) below sm_80 or where
// the build has no code for the device.
inline std::optional<KernelFamily> pick_family(int cc_major, int cc_minor, const BuildArchs& built,
                                               FamilyRequest request) {
  const int cc = cc_major * 10 + cc_minor;
  if (cc < 80) return std::nullopt;
  if (request != FamilyRequest::kSm80 && cc == 90 && built.sm90a) return KernelFamily::kSm90a;
  if (portable_image_runs(cc, built)) return KernelFamily::kSm80;
  return std::nullopt;
}

inline std::string join_archs(const std::vector<int>& archs, const char* prefix,
                              const char* sep) {
  std::string s;
  for (int a : archs) s += (s.empty() ? "" : sep) + (prefix + std::to_string(a));
  return s;
}

// The message for a device the build cannot run (no code, or PTX the driver failed to compile),
// with the rebuild that fixes it: the requested architectures plus the device's.
inline std::string image_error_message(int cc_major, int cc_minor, const BuildArchs& built,
                                       const char* cuda_error) {
  const int cc = cc_major * 10 + cc_minor;
  std::vector<int> fix = built.sass;
  bool listed = false;
  for (int a : fix) listed = listed || a == cc;
  if (!listed) fix.push_back(cc);
  const std::string sm = "sm_" + std::to_string(cc);
  const std::string rebuild = "rebuild with KF_CUDA_ARCHS=\"" + join_archs(fix, "", ";") + "\"";
  if (!portable_sass_runs(cc, built) && portable_ptx_runs(cc, built))
    return sm + " runs this build's compute_" + std::to_string(built.ptx) +
           " PTX, which the driver could not compile (" + cuda_error +
           "): update the driver, or " + rebuild;
  return "no kernel image for " + sm + " in this build (built for " +
         join_archs(built.sass, "sm_", " ") + "; " + cuda_error + "); " + rebuild;
}

}  // namespace kf::cuda
