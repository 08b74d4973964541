// chat_completion.h: what the roles of one completion share (ChatService's, chat_service.h):
// its sequence, reply stream and grammar. Internal to chat_service.cpp and chat_batch.cpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "grammar/matcher.h"
#include "runtime/chat_service.h"
#include "runtime/reply_stream.h"
#include "runtime/sequence_tokens.h"

namespace lily {

struct ChatService::Completion {
  const PreparedCompletion& p;
  std::chrono::steady_clock::time_point start;
  SequenceTokens seq;
  ReplyStream reply;
  std::optional<grammar::GrammarMatcher> grammar;  // constrained decoding: p.grammar's state
  std::vector<int32_t> stop_ids;                   // end the reply, outside its text
  Usage usage;                                     // prompt and cached tokens; the completion's are counted at the end
  Timings timings;
  bool first_token = true;
  bool cancelled = false;  // a parallel completion whose caller stopped it (KeepGoing, on_delta)

  int64_t remaining() const { return p.max_tokens - seq.produced(); }
  bool is_stop_id(int32_t id) const { return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end(); }
};

}  // namespace lily
