// device_profile.cpp: see device_profile.h.
#include "backend/cuda/device_profile.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"

namespace lily::cuda {

namespace {

DeviceProfile entry(const char* name, const char* card, int cc, int sms, int shared_kb, double gbs, int l2_mb,
                    int memory_gb) {
  DeviceProfile p;
  p.name = name, p.card = card, p.compute_capability = cc, p.multiprocessors = sms;
  p.shared_per_block = shared_kb * 1024, p.bandwidth_gbs = gbs, p.l2_bytes = int64_t(l2_mb) << 20;
  p.memory_bytes = int64_t(memory_gb) << 30, p.sm90a_code = build_has_sm90a();
  return p;
}

}  // namespace

bool build_has_sm90a() {
#ifdef LILY_CUDA_SM90A
  return true;
#else
  return false;
#endif
}

const std::vector<DeviceProfile>& known_device_profiles() {
  // Shared memory: cudaDevAttrMaxSharedMemoryPerBlockOptin (163 KB on sm_80, 99 KB on sm_86 / 89
  // / 120, 227 KB on sm_90).
  static const std::vector<DeviceProfile> table = {
      entry("sm80", "A100 80 GB (sm_80)", 80, 108, 163, 2039, 40, 80),
      entry("sm86", "RTX 3090 (sm_86)", 86, 82, 99, 936, 6, 24),
      entry("sm89", "RTX 4090 (sm_89)", 89, 128, 99, 1008, 72, 24),
      entry("sm90", "H100 SXM (sm_90)", 90, 132, 227, 3350, 50, 80),
      entry("sm120", "RTX 5090 (sm_120)", 120, 170, 99, 1792, 96, 32),
  };
  return table;
}

DeviceProfile known_device_profile(const std::string& name) {
  std::string names;
  for (const DeviceProfile& p : known_device_profiles()) {
    if (p.name == name) return p;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  }
  fail("device profile '{}': not one lily knows (device, {})", name, names);
}

DeviceProfile resolve_device_profile(const DeviceProfile& device, const std::string& forced) {
  if (forced.empty()) return device;
  DeviceProfile p = device;
  p.portable_allowed = true;
  if (forced == "device") return p;
  const DeviceProfile k = known_device_profile(forced);
  p.name = k.name, p.card = fmt::format("{} as {}", device.card, k.card), p.forced = true;
  p.compute_capability = k.compute_capability, p.multiprocessors = std::min(k.multiprocessors, device.multiprocessors);
  // Never more shared memory than the card that runs the code has.
  p.shared_per_block = std::min(k.shared_per_block, device.shared_per_block);
  return p;
}

bool runs_by_default(const DeviceProfile& p) { return p.hopper() || p.portable_allowed; }

std::string DeviceProfile::describe() const {
  return fmt::format("{}{} ({}): compute {}.{}, {} SMs, {} KB shared a block, {:.0f} GB/s, L2 {} MB, {:.1f} GB; {}",
                     name, forced ? " forced" : "", card, compute_capability / 10, compute_capability % 10,
                     multiprocessors, shared_per_block / 1024, bandwidth_gbs, l2_bytes >> 20,
                     double(memory_bytes) / double(1 << 30),
                     hopper()           ? "the Hopper kernels (wgmma, bulk copies, clusters, PDL)"
                     : portable_allowed ? "the portable kernels (sm_80 instructions; never run on a GPU yet)"
                                        : "no CUDA path by default (the portable kernels have not run yet)");
}

}  // namespace lily::cuda
