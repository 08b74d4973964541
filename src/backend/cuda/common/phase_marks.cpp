// phase_marks.cpp: see phase_marks.h.
#include "backend/cuda/common/phase_marks.h"

#include <atomic>
#include <chrono>

#include "backend/cuda/common/cuda_check.h"

namespace lily::cuda::phases {

namespace {

std::atomic<PhaseRecorder*> armed{nullptr};

int64_t host_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void mark(const char* phase, cudaStream_t stream) {
  if (PhaseRecorder* r = armed.load(std::memory_order_acquire)) r->record(phase, stream);
}

PhaseRecorder::PhaseRecorder() {
  PhaseRecorder* expected = nullptr;
  LILY_CHECK(armed.compare_exchange_strong(expected, this), "phase marks: a recorder is already armed");
}

PhaseRecorder::~PhaseRecorder() {
  armed.store(nullptr, std::memory_order_release);
  for (const Mark& m : marks_) cudaEventDestroy(m.event);
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

void PhaseRecorder::record(const char* phase, cudaStream_t stream) {
  cudaEvent_t e = nullptr;
  if (!spare_.empty()) {
    e = spare_.back();
    spare_.pop_back();
  } else {
    CUDA_CHECK(cudaEventCreate(&e));
  }
  CUDA_CHECK(cudaEventRecord(e, stream));
  marks_.push_back({phase, e, host_now_ns()});
}

Split PhaseRecorder::collect() {
  Split split;
  if (marks_.size() >= 2) {
    CUDA_CHECK(cudaEventSynchronize(marks_.back().event));
    for (size_t i = 0; i + 1 < marks_.size(); ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i].event, marks_[i + 1].event));
      Total* total = nullptr;
      for (Total& t : split.phases)
        if (t.phase == marks_[i].phase) total = &t;
      if (!total) total = &split.phases.emplace_back(Total{marks_[i].phase, 0, 0, 0});
      total->device_ms += ms;
      total->host_ms += double(marks_[i + 1].host_ns - marks_[i].host_ns) * 1e-6;
      total->count += 1;
    }
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, marks_.front().event, marks_.back().event));
    split.device_ms = ms;
    split.host_ms = double(marks_.back().host_ns - marks_.front().host_ns) * 1e-6;
  }
  for (const Mark& m : marks_) spare_.push_back(m.event);
  marks_.clear();
  return split;
}

}  // namespace lily::cuda::phases
