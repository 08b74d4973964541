#include "runtime/tool_call_forcing.h"

#include "base/error.h"

namespace lily {

const json& tool_function(const json& tool) { return tool.contains("function") ? tool["function"] : tool; }

std::string forced_call_opening(const ToolChoice& choice, const json& tools) {
  if (choice.mode == ToolChoice::Mode::function) return "<tool_call>\n<function=" + choice.function + ">\n";
  if (choice.mode != ToolChoice::Mode::required) return "";
  if (tools.is_array() && tools.size() == 1) {
    const json& f = tool_function(tools[0]);
    if (f.is_object() && f.contains("name") && f["name"].is_string())
      return "<tool_call>\n<function=" + f["name"].get<std::string>() + ">\n";
  }
  return "<tool_call>\n<function";  // not "=": see the header
}

ToolCallForcing::ToolCallForcing(std::string opening, bool starts_in_reasoning, std::optional<int32_t> think_end)
    : opening_(std::move(opening)),
      starts_in_reasoning_(starts_in_reasoning),
      think_end_(think_end),
      done_(opening_.empty()) {}

std::string ToolCallForcing::at_start() {
  if (done_ || starts_in_reasoning_) return "";
  done_ = true;
  return opening_;
}

std::optional<int32_t> ToolCallForcing::waits_for() const {
  if (done_) return std::nullopt;
  return think_end_;
}

ToolCallForcing::Step ToolCallForcing::after_round(int32_t last) {
  LILY_CHECK(waits_for(), "internal: no tool-call opening waits for the end of the reasoning");
  done_ = true;
  if (last == *think_end_) return {"\n\n" + opening_, false};
  return {"\n</think>\n\n" + opening_, true};
}

}  // namespace lily
