// programmatic_launches.h: whether this thread's prefill launches are programmatic (the scope
// that pdl_launch.cuh's launch_after_wait reads). Host code.
#pragma once

namespace lily::cuda {

// The launches of this thread are programmatic while the innermost scope says so.
class ProgrammaticLaunches {
 public:
  explicit ProgrammaticLaunches(bool on) : previous_(on_) { on_ = on; }
  ~ProgrammaticLaunches() { on_ = previous_; }
  ProgrammaticLaunches(const ProgrammaticLaunches&) = delete;
  ProgrammaticLaunches& operator=(const ProgrammaticLaunches&) = delete;
  static bool on() { return on_; }

 private:
  static inline thread_local bool on_ = false;
  bool previous_;
};

}  // namespace lily::cuda
