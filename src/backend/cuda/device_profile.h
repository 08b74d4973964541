// device_profile.h: what the kernel plan decides by (kernel_plan.h): the card's compute
// capability, the shared memory a block may ask for, its SMs, bandwidth, L2 and memory, and
// whether this build holds the Hopper kernels for it. Host-only (no CUDA headers): the profile
// table and the plan's choices per profile are tested on the CPU (tests/cuda/test_device_profile.cpp).
//
// Profiles (docs/gpus.md has the inventory of which kernel needs what):
//   hopper()   compute capability 9.0 and sm_90a machine code in this build (LILY_CUDA_SM90A):
//              wgmma, bulk copies on mbarriers, thread-block clusters, PDL. The path that runs today.
//   portable   everything else: the kernels that need only sm_80 (mma.sync, ldmatrix, cp.async),
//              within `shared_per_block`. It has never run on a GPU, so the backend takes it only
//              when asked (CudaBackendOptions::device_profile, `--device-profile`, LILY_DEVICE_PROFILE);
//              without that, a card that is not Hopper runs lily on the CPU.
// A forced profile ("sm86") takes the card's compute capability, shared-memory limit and SM count
// from the table (known_device_profiles) on whatever card runs the code (never more SMs or shared
// memory than that card has), so the consumer path can be proven on an H100; the kernels then size
// their grids by its SMs and never ask for more shared memory than it allows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lily::cuda {

struct DeviceProfile {
  int multiprocessors = 132;         // SMs (the H200's)
  int compute_capability = 90;       // major * 10 + minor
  int shared_per_block = 232448;     // opt-in dynamic shared memory a block may ask for, bytes (227 KB)
  double bandwidth_gbs = 4800;       // device memory bandwidth, GB/s (the data sheet's)
  int64_t l2_bytes = 50 << 20;       // L2 cache
  int64_t memory_bytes = 0;          // device memory (0: not known)
  bool sm90a_code = true;            // this build holds sm_90a machine code (LILY_CUDA_SM90A)
  std::string name = "sm90";         // the table's name, or "device" (as queried)
  std::string card = "NVIDIA H200";  // what it describes, for people
  bool forced = false;               // from the table in place of the card's own
  bool portable_allowed = false;     // the portable path was asked for (it has never run)

  // The sm_90a kernels: wgmma, bulk copies, clusters, programmatic dependent launch.
  bool hopper() const { return compute_capability == 90 && sm90a_code; }
  std::string describe() const;  // one line for `lily info` / `lily bench`
};

// The cards lily supports, by the name --device-profile takes: sm80 (A100 80 GB), sm86 (RTX 3090),
// sm89 (RTX 4090), sm90 (H100 SXM), sm120 (RTX 5090); public data-sheet figures.
const std::vector<DeviceProfile>& known_device_profiles();

// The table's entry `name`; throws lily::Error naming the known ones.
DeviceProfile known_device_profile(const std::string& name);

// The profile a backend runs under: `forced` empty or "device": the card as queried (`device`),
// else the table's entry over it (the card's bandwidth, L2 and memory kept: they are the
// card's that runs the code). "device" and any named profile switch the portable path on.
DeviceProfile resolve_device_profile(const DeviceProfile& device, const std::string& forced);

// Whether the CUDA backend runs under `p` by default: the Hopper path, or a portable one asked for.
bool runs_by_default(const DeviceProfile& p);

// Whether this build holds sm_90a machine code (the CMake architectures include 90a).
bool build_has_sm90a();

}  // namespace lily::cuda
