// phase_marks.h: where a prefill pass's time goes, phase by phase (measurement only).
//
// The pass calls mark("deltanet.in_proj", stream) before each phase's launches. While a
// PhaseRecorder lives, each mark records a CUDA event (and the host clock); the device time from
// one mark to the next is the earlier mark's phase. With no recorder, a mark is one load and a
// branch. `lily bench --prefill-split` prints the totals per phase, device and host clock side
// by side: a phase whose host time is its device time was bound by launching, not by its
// kernels (except where the host waits for the device: the logits' copy to pageable memory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime.h>

namespace lily::cuda::phases {

// From here until the next mark, the stream's work is `phase`'s (a string literal).
void mark(const char* phase, cudaStream_t stream);

struct Total {
  std::string phase;
  double device_ms = 0;  // sum over the phase's intervals, device clock
  double host_ms = 0;    // the same intervals on the host clock (launching, and any waits)
  int count = 0;         // how many intervals
};

struct Split {
  std::vector<Total> phases;  // in the order first marked
  double device_ms = 0;       // first mark to last, device
  double host_ms = 0;         // first mark to last, host clock
};

// Arms the marks of this process while it lives (one at a time).
class PhaseRecorder {
 public:
  PhaseRecorder();
  ~PhaseRecorder();
  PhaseRecorder(const PhaseRecorder&) = delete;
  PhaseRecorder& operator=(const PhaseRecorder&) = delete;

  // Waits for the marks' events and sums the intervals between consecutive marks; the last
  // mark only ends the one before it. Empties the record.
  Split collect();

  void record(const char* phase, cudaStream_t stream);

 private:
  struct Mark {
    const char* phase;
    cudaEvent_t event;
    int64_t host_ns;
  };
  std::vector<Mark> marks_;
  std::vector<cudaEvent_t> spare_;  // events of earlier collects, reused
};

}  // namespace lily::cuda::phases
