// kernel_trace.cpp: the host side of kernel_trace.h (the log, its setters, the CSV).
#include "backend/cuda/common/kernel_trace.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "backend/cuda/common/cuda_check.h"

namespace lily::cuda::trace {

namespace {

std::vector<LogSetter>& setters() {
  static std::vector<LogSetter> s;
  return s;
}

void set_everywhere(Log* log) {
  for (LogSetter set : setters()) set(log);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

const char* kind_name(uint32_t kind) {
  switch (kind) {
    case kind_prefetch_gemv: return "prefetch_gemv";
    case kind_mma_gemv: return "mma_gemv";
    case kind_staged_gemv: return "staged_gemv";
    case kind_deltanet: return "deltanet";
    case kind_attention_split: return "attention_split";
    case kind_attention_combine: return "attention_combine";
    case kind_moe_route: return "moe_route";
    case kind_moe_gate_up: return "moe_gate_up";
    case kind_moe_down: return "moe_down";
    case kind_argmax: return "argmax";
  }
  return "?";
}

int register_log_setter(LogSetter setter) {
  setters().push_back(setter);
  return int(setters().size());
}

bool kernel_trace_available() {
#ifdef LILY_KERNEL_TRACE
  return !setters().empty();
#else
  return false;
#endif
}

Session::Session(uint32_t capacity) : capacity_(capacity) {
  LILY_CHECK(kernel_trace_available(),
             "this build has no kernel trace: configure with -DLILY_KERNEL_TRACE=ON (measurement only)");
  const size_t bytes = sizeof(Log) + size_t(capacity) * sizeof(Record);
  CUDA_CHECK(cudaMalloc(&log_, bytes));
  CUDA_CHECK(cudaMemset(log_, 0, bytes));
  CUDA_CHECK(cudaMemcpy(&log_->capacity, &capacity_, sizeof capacity_, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
  set_everywhere(log_);
}

Session::~Session() {
  cudaDeviceSynchronize();
  for (LogSetter set : setters()) set(nullptr);
  cudaFree(log_);
}

std::vector<Record> Session::collect(uint64_t* dropped) {
  CUDA_CHECK(cudaDeviceSynchronize());
  uint32_t count = 0;
  CUDA_CHECK(cudaMemcpy(&count, &log_->count, sizeof count, cudaMemcpyDeviceToHost));
  const uint32_t kept = std::min(count, capacity_);
  std::vector<Record> records(kept);
  if (kept)
    CUDA_CHECK(cudaMemcpy(records.data(), log_->records, size_t(kept) * sizeof(Record), cudaMemcpyDeviceToHost));
  if (dropped) *dropped = count - kept;
  CUDA_CHECK(cudaMemset(&log_->count, 0, sizeof(uint32_t)));
  CUDA_CHECK(cudaDeviceSynchronize());
  return records;
}

void write_csv(const std::string& path, const std::vector<Record>& records, const std::string& comment) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "w"), &std::fclose);
  LILY_CHECK(f != nullptr, "--decode-trace: cannot write {}", path);
  uint64_t t_min = ~uint64_t(0);
  for (const Record& r : records) t_min = std::min(t_min, r.t[0]);
  std::fprintf(f.get(), "# %s\nkind,block,sm", comment.c_str());
  for (int i = 0; i < kMarks; ++i) std::fprintf(f.get(), ",t%d", i);
  std::fprintf(f.get(), "\n");
  for (const Record& r : records) {
    std::fprintf(f.get(), "%s,%u,%u", kind_name(r.kind), r.block, r.sm);
    for (int i = 0; i < kMarks; ++i)
      std::fprintf(f.get(), ",%llu", r.t[i] ? (unsigned long long)(r.t[i] - t_min) : 0ull);
    std::fprintf(f.get(), "\n");
  }
  LILY_CHECK(std::ferror(f.get()) == 0, "--decode-trace: writing {} failed", path);
}

}  // namespace lily::cuda::trace
