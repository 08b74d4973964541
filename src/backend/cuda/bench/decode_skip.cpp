// decode_skip.cpp: parts left out of the captured decode step (bench/cuda_bench.h), for measuring
// what each part costs inside the graph with nothing but `lily bench` (no timeline profiler runs
// on the GPU machine). The outputs are WRONG.
//
// While the step is captured, each part's begin() records the capture's last node so far; the
// step is one stream, so its graph is a chain and a part's launches are the nodes after its
// begin() node up to the next part's. Once captured, the skipped parts' nodes are removed and the
// chain is joined again (before the programmatic edges are made, so the rest keeps its PDL).
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/bench/cuda_bench.h"

namespace lily::cuda::bench {

namespace {

constexpr DecodePart kParts[] = {DecodePart::embed,    DecodePart::in_proj, DecodePart::mixer,
                                 DecodePart::out_proj, DecodePart::route,   DecodePart::gate_up,
                                 DecodePart::down,     DecodePart::advance, DecodePart::lm_head};

std::set<DecodePart> parse_parts(const std::string& list) {
  std::set<DecodePart> parts;
  std::stringstream in(list);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    if (name == "moe") {
      parts.insert({DecodePart::route, DecodePart::gate_up, DecodePart::down});
      continue;
    }
    bool known = false;
    for (DecodePart p : kParts)
      if (name == part_name(p)) parts.insert(p), known = true;
    LILY_CHECK(known,
               "--decode-skip: unknown part \"{}\" (embed, in_proj, mixer, out_proj, moe, route, gate_up, "
               "down, advance, lm_head)",
               name);
  }
  return parts;
}

// The node the next captured launch will depend on (nullptr: nothing captured yet).
cudaGraphNode_t capture_leaf(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t n = 0;
  CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, nullptr, &n));
  LILY_CHECK(status == cudaStreamCaptureStatusActive, "--decode-skip: the decode step is not being captured");
  LILY_CHECK(n <= 1, "--decode-skip: the decode step is not a chain ({} open ends)", n);
  return n ? deps[0] : nullptr;
}

std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t node) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphNodeGetDependencies(node, nodes.data(), nullptr, &n));
  return nodes;
}

std::vector<cudaGraphNode_t> dependents(cudaGraphNode_t node) {
  size_t n = 0;
  CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nodes.data(), nullptr, &n));
  return nodes;
}

// The node after `node` in the chain (the root when node is nullptr).
cudaGraphNode_t next_in_chain(cudaGraph_t graph, cudaGraphNode_t node) {
  std::vector<cudaGraphNode_t> next;
  if (node) {
    next = dependents(node);
  } else {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetRootNodes(graph, nullptr, &n));
    next.resize(n);
    CUDA_CHECK(cudaGraphGetRootNodes(graph, next.data(), &n));
  }
  LILY_CHECK(next.size() == 1, "--decode-skip: the decode graph is not a chain ({} successors)", next.size());
  return next[0];
}

// Removes `node`, joining each of its dependencies to each of its dependents.
void remove_and_join(cudaGraph_t graph, cudaGraphNode_t node) {
  const std::vector<cudaGraphNode_t> from = dependencies(node), to = dependents(node);
  CUDA_CHECK(cudaGraphDestroyNode(node));
  for (cudaGraphNode_t f : from)
    for (cudaGraphNode_t t : to) CUDA_CHECK(cudaGraphAddDependencies(graph, &f, &t, nullptr, 1));
}

class DecodeSkip final : public DecodeStepObserver {
 public:
  explicit DecodeSkip(std::set<DecodePart> skip) : skip_(std::move(skip)) {}

  void begin(DecodePart part, cudaStream_t stream) override { marks_.push_back({part, capture_leaf(stream)}); }
  void end(cudaStream_t stream) override { end_ = capture_leaf(stream); }

  void captured(cudaGraph_t graph) override {
    // Each part's nodes: after its mark's node, up to and including the next mark's (or end's).
    std::vector<cudaGraphNode_t> doomed;
    for (size_t i = 0; i < marks_.size(); ++i) {
      const cudaGraphNode_t last = i + 1 < marks_.size() ? marks_[i + 1].before : end_;
      if (last == marks_[i].before || !skip_.count(marks_[i].part)) continue;
      for (cudaGraphNode_t n = marks_[i].before;;) {
        n = next_in_chain(graph, n);
        doomed.push_back(n);
        if (n == last) break;
      }
    }
    for (cudaGraphNode_t n : doomed) remove_and_join(graph, n);
    if (!reported_) {
      std::string names;
      for (DecodePart p : skip_) names += std::string(names.empty() ? "" : ",") + part_name(p);
      std::fprintf(stderr, "lily: --decode-skip %s: %zu launches left out of each decode step; outputs are wrong\n",
                   names.c_str(), doomed.size());
      reported_ = true;
    }
    marks_.clear();
    end_ = nullptr;
  }

 private:
  struct Mark {
    DecodePart part;
    cudaGraphNode_t before;  // the last node before the part's launches
  };
  std::set<DecodePart> skip_;
  std::vector<Mark> marks_;
  cudaGraphNode_t end_ = nullptr;
  bool reported_ = false;
};

}  // namespace

std::unique_ptr<DecodeStepObserver> decode_skip(const std::string& parts) {
  return std::make_unique<DecodeSkip>(parse_parts(parts));
}

}  // namespace lily::cuda::bench
