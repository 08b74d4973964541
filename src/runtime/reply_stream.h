// reply_stream.h: a reply's text as it streams: token ids and text in, ChatDeltas out.
//
// Generated ids go through the incremental decoder (StreamingDecoder: whole UTF-8 characters);
// text pushed as such (push_text, e.g. by tests) joins after it. Then the stop strings
// (completion_text.h: nothing of a stop string is released) and, for chats, the output parser
// (reasoning / content / tool calls, chat/output_parser.h). What one push releases goes to the
// caller as one ChatDelta, with the pushed token's logprobs even when its text is held back (a
// possible stop string, an unfinished tag): they describe the token, not the text. A push that
// releases nothing and has no logprobs sends nothing. whole() is the sum of every delta made
// (its tool_call_deltas left empty: whole.tool_calls has the calls). Each tool call gets its id
// when it starts; its deltas and its complete ToolCall carry the same one.
//
// The reply ends early in two ways, told apart because they finish differently: a stop string
// completed (stopped(): the rest of the text is dropped, finish_reason "stop"), or the callback
// returned false (cancelled(): the client is gone and is sent nothing more, not even the tail).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/output_parser.h"
#include "runtime/chat_service.h"
#include "runtime/completion_text.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

namespace lily {

class ReplyStream {
 public:
  // parser: chats only (text completions stream plain content).
  ReplyStream(const Tokenizer& tokenizer, std::optional<OutputParserOptions> parser, std::vector<std::string> stop,
              DeltaCallback on_delta);

  // A generated token other than a stop token (those end the reply outside its text).
  // Returns false when the reply ends here (stopped() or cancelled()).
  bool push_token(const GeneratedToken& token);
  // Text that did not come from the model's tokens. Returns false when the reply ends here.
  bool push_text(std::string_view text);
  // The end of generation: releases what the decoder, the stop strings and the parser held
  // back, as one last delta. Nothing once cancelled. stopped() keeps telling how streaming
  // ended: a stop string that only this tail completes cuts the text, not the finish reason.
  void finish();

  bool stopped() const { return stopped_; }                            // by a stop string, while streaming
  const std::string& stop_string() const { return stops_.matched(); }  // the one, when stopped()
  // Tokens pushed while the reply was in its reasoning (chat/output_parser.h in_reasoning()).
  int64_t reasoning_tokens() const { return reasoning_tokens_; }
  bool cancelled() const { return cancelled_; }
  bool open() const { return !stopped_ && !cancelled_; }
  const ChatDelta& whole() const { return whole_; }
  ChatDelta take_whole() { return std::move(whole_); }

 private:
  // Sends `released` (after the stop strings) and notes why the reply ends, if it does.
  bool deliver(std::string_view released, std::vector<TokenLogprobs> logprobs);
  // One delta: released text through the parser (at_end: and its finish()), and logprobs;
  // added to whole_, and sent unless empty. Returns the callback's answer.
  bool emit(std::string_view released, bool at_end, std::vector<TokenLogprobs> logprobs);
  ChatDelta parse(std::string_view released, bool at_end);
  TokenLogprobs logprobs_of(const GeneratedToken& token) const;
  LogprobAlternative alternative(int32_t token, float logprob) const;

  Tokenizer tokenizer_;
  StreamingDecoder decoder_;
  StopStrings stops_;
  std::optional<OutputParser> parser_;
  DeltaCallback on_delta_;
  ChatDelta whole_;
  std::vector<std::string> call_ids_;  // by call index, given when a call starts
  size_t calls_completed_ = 0;
  int64_t reasoning_tokens_ = 0;
  bool stopped_ = false, cancelled_ = false;
};

}  // namespace lily
