#include "runtime/reply_stream.h"

namespace lily {

ReplyStream::ReplyStream(const Tokenizer& tokenizer, std::optional<OutputParserOptions> parser,
                         std::vector<std::string> stop, DeltaCallback on_delta)
    : tokenizer_(tokenizer), decoder_(tokenizer), stops_(std::move(stop)), on_delta_(std::move(on_delta)) {
  if (parser) parser_.emplace(std::move(*parser));
}

bool ReplyStream::push_token(const GeneratedToken& token) {
  if (parser_ && parser_->in_reasoning()) ++reasoning_tokens_;
  std::vector<TokenLogprobs> logprobs;
  if (token.logprob) logprobs.push_back(logprobs_of(token));
  return deliver(stops_.push(decoder_.push(token.id)), std::move(logprobs));
}

bool ReplyStream::push_text(std::string_view text) { return deliver(stops_.push(text), {}); }

bool ReplyStream::deliver(std::string_view released, std::vector<TokenLogprobs> logprobs) {
  const bool ok = emit(released, false, std::move(logprobs));
  // A completed stop string ends the reply as a stop, even when the client left on this delta.
  if (stops_.stopped()) stopped_ = true;
  else if (!ok) cancelled_ = true;
  return ok && !stopped_;
}

void ReplyStream::finish() {
  if (cancelled_) return;
  // Once stopped, the decoder's held bytes come after the stop string: dropped with the rest.
  std::string tail = stopped_ ? std::string() : stops_.push(decoder_.flush());
  tail += stops_.flush();
  if (!emit(tail, true, {})) cancelled_ = true;
}

bool ReplyStream::emit(std::string_view released, bool at_end, std::vector<TokenLogprobs> logprobs) {
  ChatDelta d = parse(released, at_end);
  d.logprobs = std::move(logprobs);
  whole_.reasoning += d.reasoning;
  whole_.content += d.content;
  whole_.tool_calls.insert(whole_.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  whole_.logprobs.insert(whole_.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
  if (d.empty()) return true;
  return on_delta_(d);
}

ChatDelta ReplyStream::parse(std::string_view released, bool at_end) {
  ChatDelta d;
  if (!parser_) {
    d.content = std::string(released);
    return d;
  }
  ParserOutput out = parser_->push(released);
  if (at_end) {
    ParserOutput tail = parser_->finish();
    out.reasoning += tail.reasoning;
    out.content += tail.content;
    for (auto& c : tail.tool_calls) out.tool_calls.push_back(std::move(c));
    for (auto& p : tail.tool_call_pieces) out.tool_call_pieces.push_back(std::move(p));
  }
  d.reasoning = std::move(out.reasoning);
  d.content = std::move(out.content);
  for (ToolCallPiece& p : out.tool_call_pieces) {
    ToolCallDelta delta{int(p.index), "", std::move(p.name), std::move(p.arguments)};
    if (!delta.name.empty()) {  // the call starts
      call_ids_.push_back(new_tool_call_id());
      delta.id = call_ids_.back();
    }
    d.tool_call_deltas.push_back(std::move(delta));
  }
  for (auto& c : out.tool_calls) {
    d.tool_calls.push_back({call_ids_.at(calls_completed_++), std::move(c.name), std::move(c.arguments_json)});
  }
  return d;
}

TokenLogprobs ReplyStream::logprobs_of(const GeneratedToken& token) const {
  TokenLogprobs lp{alternative(token.id, token.logprob->logprob), {}};
  for (const TokenLogprob& alt : token.top) lp.top.push_back(alternative(alt.token, alt.logprob));
  return lp;
}

LogprobAlternative ReplyStream::alternative(int32_t token, float logprob) const {
  LogprobAlternative a;
  a.token = tokenizer_.decode(std::span<const int32_t>(&token, 1));
  a.bytes = tokenizer_.token_bytes(token);
  a.logprob = logprob;
  return a;
}

}  // namespace lily
