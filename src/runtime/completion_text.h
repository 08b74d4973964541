// completion_text.h: stop strings over streamed text.
//
// The model's text arrives in pieces (whole UTF-8 characters, from StreamingDecoder). A stop
// string may be split across pieces, so the tail of the text that could still become a stop
// string is held back: nothing of a stop string ever reaches the client, not even a prefix
// of it that later turns out to be one. Stop strings are matched on the raw output text,
// before it is split into reasoning / content / tool calls (as vLLM does).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lily {

class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);

  // Appends `text`; returns what can be released now. When a stop string completes, the
  // result ends just before it, stopped() becomes true, and later calls return "".
  std::string push(std::string_view text);
  // End of generation: releases what was held back (nothing once stopped).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string, once stopped()

 private:
  std::vector<std::string> stops_;
  std::string held_, matched_;
  bool stopped_ = false;
};

}  // namespace lily
