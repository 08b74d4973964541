// output_parser.cpp: the streaming reasoning / content / tool-call splitter (rules in the header).
#include "chat/output_parser.h"

#include "base/error.h"

#include <algorithm>
#include <utility>

namespace lily {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kToolCallClose = "</tool_call>";

using tool_call_syntax::is_space;
using tool_call_syntax::kFunctionOpen;
using tool_call_syntax::skip_space;

// `s` is a proper prefix of `tag` (so more text may complete it); "" counts.
bool could_become(std::string_view s, std::string_view tag) { return s.size() < tag.size() && tag.starts_with(s); }

// The length of the longest suffix of `s` that is a proper prefix of one of `tags`.
size_t partial_tag_suffix(std::string_view s, const std::vector<std::string_view>& tags) {
  size_t best = 0;
  for (std::string_view tag : tags) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > best; --n) {
      if (s.ends_with(tag.substr(0, n))) {
        best = n;
        break;
      }
    }
  }
  return best;
}

// The largest cut <= `end` that does not split a UTF-8 character whose lead byte is present.
size_t utf8_safe_end(std::string_view s, size_t end) {
  size_t lead = end;
  int continuation = 0;
  while (lead > 0 && continuation < 3 && (static_cast<unsigned char>(s[lead - 1]) & 0xC0) == 0x80) {
    --lead;
    ++continuation;
  }
  if (lead == 0) return end;
  unsigned char c = static_cast<unsigned char>(s[lead - 1]);
  size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
  return (end - (lead - 1) < length) ? lead - 1 : end;
}

}  // namespace

std::pair<size_t, size_t> OutputParser::TextSection::trimmed_range(const std::string& s) const {
  size_t begin = 0;
  if (trim_leading_) {
    while (begin < s.size() && (s[begin] == '\n' || s[begin] == '\r')) ++begin;
  }
  size_t end = s.size();
  while (end > begin && is_space(s[end - 1])) --end;
  return {begin, end};
}

std::string OutputParser::TextSection::write(std::string_view text) {
  std::string s = std::move(held_);
  s += text;
  held_.clear();
  auto [begin, end] = trimmed_range(s);
  end = std::max(begin, utf8_safe_end(s, end));
  held_ = s.substr(end);
  if (end > begin) trim_leading_ = false;
  return s.substr(begin, end - begin);
}

std::string OutputParser::TextSection::end() {
  std::string s = std::move(held_);
  held_.clear();
  auto [begin, end] = trimmed_range(s);
  if (end > begin) trim_leading_ = false;
  return s.substr(begin, end - begin);
}

OutputParser::OutputParser(OutputParserOptions options)
    : options_(std::move(options)),
      schemas_(options_.tools),
      mode_(options_.starts_in_reasoning ? Mode::kReasoning : Mode::kContent) {}

ParserOutput OutputParser::push(std::string_view text) {
  LILY_CHECK(!finished_, "OutputParser::push after finish");
  ParserOutput out;
  buffer_ += text;
  process(out, /*at_end=*/false);
  return out;
}

ParserOutput OutputParser::finish() {
  LILY_CHECK(!finished_, "OutputParser::finish called twice");
  ParserOutput out;
  process(out, /*at_end=*/true);
  out.reasoning += reasoning_.end();
  out.content += content_.end();
  finished_ = true;
  return out;
}

void OutputParser::process(ParserOutput& out, bool at_end) {
  while (true) {
    bool progress = false;
    if (mode_ == Mode::kReasoning && !think_open_checked_) {
      progress = step_think_open(at_end);
    } else if (mode_ == Mode::kToolCall) {
      progress = step_tool_call(out, at_end);
    } else {
      progress = step_text(out, at_end);
    }
    if (!progress) return;
  }
}

// A <think> opening the reasoning (after optional whitespace) is dropped.
bool OutputParser::step_think_open(bool at_end) {
  size_t start = skip_space(buffer_, 0);
  std::string_view rest = std::string_view(buffer_).substr(start);
  if (rest.starts_with(kThinkOpen)) {
    buffer_.erase(0, start + kThinkOpen.size());
  } else if (!at_end && could_become(rest, kThinkOpen)) {
    return false;
  }
  think_open_checked_ = true;
  return true;
}

// Reasoning or content: emit text up to the next tag that changes the mode.
bool OutputParser::step_text(ParserOutput& out, bool at_end) {
  bool reasoning = mode_ == Mode::kReasoning;
  TextSection& section = reasoning ? reasoning_ : content_;
  std::string& sink = reasoning ? out.reasoning : out.content;

  std::vector<std::string_view> tags;
  if (options_.parse_tool_calls) tags.push_back(kToolCallOpen);
  if (reasoning || (implicit_reasoning_end_ && !stray_think_end_dropped_)) tags.push_back(kThinkClose);

  std::string_view buffer = buffer_;
  size_t pos = std::string_view::npos;
  std::string_view tag;
  for (std::string_view t : tags) {
    size_t p = buffer.find(t);
    if (p < pos) {
      pos = p;
      tag = t;
    }
  }

  if (pos == std::string_view::npos) {
    size_t keep = at_end ? 0 : partial_tag_suffix(buffer, tags);
    sink += section.write(buffer.substr(0, buffer.size() - keep));
    buffer_.erase(0, buffer.size() - keep);
    return false;
  }

  if (tag == kThinkClose) {
    sink += section.write(buffer.substr(0, pos));
    if (reasoning) {
      sink += section.end();
      mode_ = Mode::kContent;
    } else {
      stray_think_end_dropped_ = true;
    }
    buffer_.erase(0, pos + tag.size());
    return true;
  }

  // <tool_call>: a call only when <function= follows (modulo whitespace).
  size_t after = pos + tag.size();
  std::string_view next = buffer.substr(skip_space(buffer, after));
  if (next.starts_with(kFunctionOpen)) {
    sink += section.write(buffer.substr(0, pos));
    if (reasoning) {
      sink += section.end();
      implicit_reasoning_end_ = true;
    }
    buffer_.erase(0, pos);
    mode_ = Mode::kToolCall;
    tool_call_scanned_ = 0;
    return true;
  }
  if (!at_end && could_become(next, kFunctionOpen)) {  // wait for the look-ahead
    sink += section.write(buffer.substr(0, pos));
    buffer_.erase(0, pos);
    return false;
  }
  sink += section.write(buffer.substr(0, after));  // plain text
  buffer_.erase(0, after);
  return true;
}

// buffer_ starts with <tool_call>: the call's name decides whether the block is a call.
bool OutputParser::step_tool_call(ParserOutput& out, bool at_end) {
  if (call_) return step_call_body(out, at_end);
  if (block_refused_) return step_refused_block(out, at_end);
  return step_call_name(out, at_end);
}

// Waits for the '>' of <function=NAME>; an accepted NAME starts the call.
bool OutputParser::step_call_name(ParserOutput& out, bool at_end) {
  const size_t name_begin = skip_space(buffer_, kToolCallOpen.size()) +
                            kFunctionOpen.size();  // step_text saw <function=
  const FunctionName name = read_function_name(std::string_view(buffer_).substr(name_begin), schemas_, at_end);
  if (name.status == FunctionName::Status::kPending) return false;
  if (name.status == FunctionName::Status::kRejected) {
    block_refused_ = true;
    tool_call_scanned_ = 0;
    return true;
  }
  out.content += content_.end();  // drops the whitespace before the call
  call_.emplace(name.name, schemas_);
  add_piece(out, name.name);
  buffer_.erase(0, name_begin + name.end);
  return true;
}

// A block that is not a call goes to content verbatim once it has ended.
bool OutputParser::step_refused_block(ParserOutput& out, bool at_end) {
  const size_t close = buffer_.find(kToolCallClose, tool_call_scanned_);
  if (close == std::string::npos && !at_end) {
    tool_call_scanned_ = buffer_.size() - std::min(buffer_.size(), kToolCallClose.size() - 1);
    return false;
  }
  const size_t block_end = close == std::string::npos ? buffer_.size() : close + kToolCallClose.size();
  out.content += content_.write(std::string_view(buffer_).substr(0, block_end));
  buffer_.erase(0, block_end);
  block_refused_ = false;
  mode_ = Mode::kContent;
  return true;
}

// The body of an accepted call goes through its ToolCallStream until </tool_call> or the end.
bool OutputParser::step_call_body(ParserOutput& out, bool at_end) {
  const size_t close = buffer_.find(kToolCallClose);
  const bool ends = close != std::string::npos || at_end;
  size_t body_end = close;
  if (close == std::string::npos) {
    body_end = buffer_.size() - (at_end ? 0 : partial_tag_suffix(buffer_, {kToolCallClose}));
  }
  call_->push(std::string_view(buffer_).substr(0, body_end));
  if (ends) call_->finish();
  add_piece(out, "");
  if (!ends) {
    buffer_.erase(0, body_end);
    return false;
  }
  out.tool_calls.push_back(ParsedToolCall{call_->function(), call_->arguments()});
  call_.reset();
  buffer_.erase(0, close == std::string::npos ? buffer_.size() : close + kToolCallClose.size());
  mode_ = Mode::kContent;
  return true;
}

// The current call's new arguments (and its name when it starts) as one piece of this output.
void OutputParser::add_piece(ParserOutput& out, std::string name) {
  std::string arguments = call_->take();
  const size_t index = name.empty() ? calls_started_ - 1 : calls_started_++;
  if (name.empty() && arguments.empty()) return;
  if (!out.tool_call_pieces.empty() && out.tool_call_pieces.back().index == index) {
    out.tool_call_pieces.back().arguments += arguments;
    return;
  }
  out.tool_call_pieces.push_back(ToolCallPiece{index, std::move(name), std::move(arguments)});
}

}  // namespace lily
