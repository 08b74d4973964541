// tool_call_stream.cpp: a tool call's body parsed as it streams (rules in the header).
#include "chat/tool_call_stream.h"

#include <fmt/format.h>

#include <utility>

namespace lily {
namespace {

using tool_call_syntax::kFunctionClose;
using tool_call_syntax::kParameterClose;
using tool_call_syntax::kParameterOpen;
using tool_call_syntax::skip_space;
using tool_call_syntax::tag_name;

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// `s` is a proper prefix of `tag` (more text may complete it).
bool could_become(std::string_view s, std::string_view tag) { return s.size() < tag.size() && tag.starts_with(s); }

// The length of the UTF-8 sequence that `lead` starts; 0 when it starts none.
size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `b` may follow `started` (a lead byte and maybe continuation bytes) in valid UTF-8:
// no overlong forms, no surrogates, nothing beyond U+10FFFF.
bool continues(std::string_view started, unsigned char b) {
  if ((b & 0xC0) != 0x80) return false;
  if (started.size() > 1) return true;
  switch (static_cast<unsigned char>(started[0])) {
    case 0xE0: return b >= 0xA0;
    case 0xED: return b <= 0x9F;
    case 0xF0: return b >= 0x90;
    case 0xF4: return b <= 0x8F;
    default: return true;
  }
}

// One ASCII character as nlohmann's dump escapes it.
void escape_ascii(char c, std::string& out) {
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
      } else {
        out += c;
      }
  }
}

}  // namespace

FunctionName read_function_name(std::string_view text, const ToolSchemas& schemas, bool at_end) {
  FunctionName result;
  const size_t stop = text.find_first_of("<>");
  if (stop == std::string_view::npos) {
    if (at_end) result.status = FunctionName::Status::kRejected;
    return result;
  }
  std::optional<std::string> name = text[stop] == '>' ? tag_name(text.substr(0, stop)) : std::nullopt;
  if (!name || !schemas.allows(*name)) {
    result.status = FunctionName::Status::kRejected;
    return result;
  }
  result.status = FunctionName::Status::kAccepted;
  result.name = std::move(*name);
  result.end = stop + 1;
  return result;
}

// ---- JsonStringWriter -----------------------------------------------------------------------

void JsonStringWriter::write(std::string_view text, std::string& out) {
  for (char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (!held_.empty()) {
      if (continues(held_, b)) {
        held_ += c;
        if (held_.size() == sequence_length(static_cast<unsigned char>(held_[0]))) {
          out += held_;
          held_.clear();
        }
        continue;
      }
      out += kReplacement;  // the sequence broke off: its valid prefix is one U+FFFD, b starts afresh
      held_.clear();
    }
    const size_t n = sequence_length(b);
    if (n == 1) {
      escape_ascii(c, out);
    } else if (n == 0) {
      out += kReplacement;
    } else {
      held_ += c;
    }
  }
}

void JsonStringWriter::flush(std::string& out) {
  if (!held_.empty()) out += kReplacement;
  held_.clear();
}

// ---- ToolCallStream -------------------------------------------------------------------------

ToolCallStream::ToolCallStream(std::string function, const ToolSchemas& schemas)
    : function_(std::move(function)), schemas_(schemas) {
  emit("{");
}

void ToolCallStream::push(std::string_view body_text) {
  if (state_ == State::kDone) return;  // after </function>: dropped
  buf_ += body_text;
  run(/*at_end=*/false);
}

void ToolCallStream::finish() {
  if (state_ != State::kDone) run(/*at_end=*/true);
}

std::string ToolCallStream::take() { return std::exchange(unread_, std::string()); }

void ToolCallStream::run(bool at_end) {
  bool progress = true;
  while (progress && state_ != State::kDone) {
    progress = state_ == State::kBetween ? step_between(at_end) : step_value(at_end);
  }
  if (state_ == State::kDone) {
    buf_.clear();
  } else {
    buf_.erase(0, pos_);
  }
  pos_ = 0;
}

// Between parameters: whitespace, <parameter=NAME>, </function>; anything else is dropped.
bool ToolCallStream::step_between(bool at_end) {
  pos_ = skip_space(buf_, pos_);
  const std::string_view rest = std::string_view(buf_).substr(pos_);
  auto drop_to_next_tag = [&] { pos_ = std::min(buf_.find('<', pos_ + 1), buf_.size()); };
  if (rest.empty()) {
    if (at_end) close_arguments();
    return at_end;
  }
  if (rest.starts_with(kFunctionClose)) {
    pos_ += kFunctionClose.size();
    function_closed_ = true;
    close_arguments();
    return true;
  }
  if (rest.starts_with(kParameterOpen)) {
    const size_t name_begin = pos_ + kParameterOpen.size();
    const size_t stop = buf_.find_first_of("<>", name_begin);
    if (stop == std::string::npos && !at_end) return false;
    if (stop != std::string::npos && buf_[stop] == '>') {
      if (std::optional<std::string> name = tag_name(std::string_view(buf_).substr(name_begin, stop - name_begin))) {
        pos_ = stop + 1;
        open_value(std::move(*name));
        return true;
      }
    }
    drop_to_next_tag();  // not a parameter tag
    return true;
  }
  if (!at_end && (could_become(rest, kParameterOpen) || could_become(rest, kFunctionClose))) return false;
  drop_to_next_tag();
  return true;
}

// Inside a value: releases its text up to the first '<' that ends it or may yet end it.
bool ToolCallStream::step_value(bool at_end) {
  if (at_value_start_) {
    if (pos_ == buf_.size() && !at_end) return false;
    if (pos_ < buf_.size() && buf_[pos_] == '\n') ++pos_;  // the one leading newline
    at_value_start_ = false;
  }
  // The value's text ends before one trailing newline, which is the format's, not the value's.
  auto text_end = [&](size_t end) { return end > pos_ && buf_[end - 1] == '\n' ? end - 1 : end; };
  for (size_t lt = buf_.find('<', pos_); lt != std::string::npos; lt = buf_.find('<', lt + 1)) {
    Match m = classify(lt, at_end);
    if (m.kind == Closer::kNone) continue;
    write_value(pos_, text_end(lt));
    if (m.kind == Closer::kMaybe) {
      if (!at_end) return false;
      m = {Closer::kFunctionEnd, buf_.size()};  // the block ended inside a closing tag: not the value's text
    } else if (m.kind == Closer::kFunctionEnd) {
      function_closed_ = true;
    }
    close_value();
    pos_ = m.resume;
    if (m.kind == Closer::kFunctionEnd) close_arguments();
    return true;
  }
  write_value(pos_, text_end(buf_.size()));
  if (!at_end) return false;
  close_value();  // the block ended inside the value
  pos_ = buf_.size();
  close_arguments();
  return true;
}

// Whether the '<' at `lt` (inside a value) starts what ends the value (see the header); kMaybe
// while the text so far could still become it. at_end: the block ended after buf_.
ToolCallStream::Match ToolCallStream::classify(size_t lt, bool at_end) const {
  const std::string_view buf = buf_;
  const std::string_view rest = buf.substr(lt);
  const Match none{}, maybe{Closer::kMaybe, 0};
  // "</function>" and then only whitespace to the end of the block.
  auto function_end_at = [&](size_t at) -> Match {
    const size_t end = skip_space(buf, at + kFunctionClose.size());
    if (end < buf.size()) return none;
    return at_end ? Match{Closer::kFunctionEnd, end} : maybe;
  };
  if (rest.starts_with(kParameterClose)) {
    const size_t after = skip_space(buf, lt + kParameterClose.size());
    const std::string_view next = buf.substr(after);
    if (next.starts_with(kParameterOpen)) return {Closer::kNextParameter, after};
    if (next.starts_with(kFunctionClose)) return function_end_at(after);
    if (next.empty()) return at_end ? Match{Closer::kParameterEnd, after} : maybe;
    return could_become(next, kParameterOpen) || could_become(next, kFunctionClose) ? maybe : none;
  }
  if (rest.starts_with(kFunctionClose)) return function_end_at(lt);
  // "\n<parameter=NAME>" naming another parameter of the schema: this one lacks its </parameter>.
  const bool after_newline = lt > pos_ && buf[lt - 1] == '\n';
  if (after_newline && rest.starts_with(kParameterOpen)) {
    const size_t name_begin = lt + kParameterOpen.size();
    const size_t stop = buf.find_first_of("<>", name_begin);
    if (stop == std::string_view::npos) return maybe;
    std::optional<std::string> name = buf[stop] == '>' ? tag_name(buf.substr(name_begin, stop - name_begin))
                                                       : std::nullopt;
    if (name && *name != parameter_ && schemas_.find_parameter(function_, *name) != nullptr) {
      return {Closer::kNextParameter, lt};
    }
    return none;
  }
  const bool partial = could_become(rest, kParameterClose) || could_become(rest, kFunctionClose) ||
                       (after_newline && could_become(rest, kParameterOpen));
  return partial ? maybe : none;
}

void ToolCallStream::open_value(std::string name) {
  state_ = State::kValue;
  at_value_start_ = true;
  raw_.clear();
  schema_ = schemas_.find_parameter(function_, name);
  as_string_ = value_is_plain_string(schema_);
  skip_value_ = !seen_.insert(name).second;
  parameter_ = std::move(name);
  if (skip_value_) return;
  std::string head = first_parameter_ ? "" : ", ";
  first_parameter_ = false;
  head += dump_json_python_style(json(parameter_)) + ": ";
  if (as_string_) head += '"';
  emit(head);
}

void ToolCallStream::write_value(size_t from, size_t to) {
  if (to > from && !skip_value_) {
    const std::string_view text = std::string_view(buf_).substr(from, to - from);
    if (as_string_) {
      std::string escaped;
      string_.write(text, escaped);
      emit(escaped);
    } else {
      raw_ += text;
    }
  }
  pos_ = std::max(pos_, to);
}

void ToolCallStream::close_value() {
  state_ = State::kBetween;
  if (skip_value_) return;
  if (as_string_) {
    std::string tail;
    string_.flush(tail);
    emit(tail + '"');
  } else {
    emit(dump_json_python_style(convert_parameter_value(raw_, schema_)));
  }
}

void ToolCallStream::close_arguments() {
  emit("}");
  state_ = State::kDone;
}

void ToolCallStream::emit(std::string_view json_text) {
  arguments_ += json_text;
  unread_ += json_text;
}

std::optional<ParsedToolCall> parse_tool_call_xml(std::string_view body, const ToolSchemas& schemas,
                                                  bool require_function_end) {
  size_t pos = skip_space(body, 0);
  if (!body.substr(pos).starts_with(tool_call_syntax::kFunctionOpen)) return std::nullopt;
  pos += tool_call_syntax::kFunctionOpen.size();
  const FunctionName name = read_function_name(body.substr(pos), schemas, /*at_end=*/true);
  if (name.status != FunctionName::Status::kAccepted) return std::nullopt;
  ToolCallStream call(name.name, schemas);
  call.push(body.substr(pos + name.end));
  call.finish();
  if (require_function_end && !call.function_closed()) return std::nullopt;
  return ParsedToolCall{name.name, call.arguments()};
}

}  // namespace lily
