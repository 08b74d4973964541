// kernel_trace.h: where a decode step's time goes, block by block (measurement only).
//
// A build configured with -DLILY_KERNEL_TRACE=ON compiles marks into the decode kernels
// (kernel_trace.cuh): thread 0 of every block of a traced kernel reads %globaltimer when the
// block starts, at up to four points of the kernel's own (its header says which), and when it
// ends, and writes one Record. `lily bench --decode-trace FILE` arms a log for a few replayed steps
// and writes the records out; tools/decode_trace.py turns them into each launch's timeline (when
// its first block started, when its wait released, its phases, when its last block ended). In
// any other build the marks compile to nothing and kernel_trace_available() is false.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lily::cuda::trace {

// The traced kernels (Record::kind).
enum Kind : uint32_t {
  kind_prefetch_gemv = 1,  // gemv_prefetch.cu   marks: waited, input staged, weights in, math
  kind_mma_gemv,           // gemv.cu mma        marks: waited, input staged, -, math
  kind_staged_gemv,        // gemv.cu 8-bit      marks: waited, input staged, -, math
  kind_deltanet,           // deltanet_decode    marks: waited, inputs, -, state written
  kind_attention_split,    // attention_decode   marks: waited, q staged, -, split done
  kind_attention_combine,  //                    marks: waited, -, -, -
  kind_moe_route,          // moe_route.cu       marks: waited, x normed, -, logits
  kind_moe_gate_up,        // gate/up (either)   marks: waited, expert chosen, weights in, math
  kind_moe_down,           // moe_down.cu        marks: waited, act staged, choice made (before the wait), math
  kind_argmax,             // argmax.cu          marks: waited
  kind_count
};
const char* kind_name(uint32_t kind);

constexpr int kMarks = 6;  // t[0] block start, t[1..4] the kernel's marks (0: not reached), t[5] end

struct Record {
  uint32_t kind, block, sm, unused;
  uint64_t t[kMarks];  // %globaltimer, ns
};

struct Log {
  uint32_t count, capacity, unused[2];
  Record records[1];  // [capacity]
};

// Whether this build has the marks compiled in.
bool kernel_trace_available();

// While it lives, every traced kernel's blocks append to a device log of `capacity` records
// (the records past it are counted, not kept). Throws when kernel_trace_available() is false.
class Session {
 public:
  explicit Session(uint32_t capacity);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  // Waits for the device, copies the records out (the kept ones) and empties the log.
  std::vector<Record> collect(uint64_t* dropped = nullptr);

 private:
  Log* log_ = nullptr;
  uint32_t capacity_;
};

// Writes records as CSV (kind name, block, sm, t0..t5 in ns from the earliest t0; 0 = not reached).
void write_csv(const std::string& path, const std::vector<Record>& records, const std::string& comment);

// Internal: each traced translation unit registers a setter for its own copy of the log pointer.
using LogSetter = void (*)(Log*);
int register_log_setter(LogSetter setter);

}  // namespace lily::cuda::trace
