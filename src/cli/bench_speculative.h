// bench_speculative.h: `lily bench --speculate K`, speculative decoding against plain decoding in
// the same run: greedy generate() with and without the MTP head's drafts, the effective decode
// tokens/s of each, the tokens a verify step yields and the acceptance per draft position.
//
// Two contexts to decode from. Random (the default): per --decode-depths D, D random tokens
// (what a synthetic model on the GPU has), so the acceptance is not the model's; with
// --assume-acceptance the verify forces given rates, to measure the pipeline's cost (the tokens
// are then not the model's either). Chat (--chat, --prompt, --prompt-file): a real request, one
// user message rendered through the model's chat template and tokenizer, decoded until its stop
// token or --decode-tokens: the acceptance is the model's own on its own reply.
//
// Greedy speculative decoding gives plain decoding's tokens exactly; a run where they differ
// prints its table and then fails (a non-zero exit), naming the first difference.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tokenizer/tokenizer.h"

namespace lily::cli {

struct SpeculativeBench {
  int drafts = 0;               // --speculate K
  std::vector<double> assumed;  // --assume-acceptance: per draft position, non-increasing; empty: the model's
  int tokens = 0;               // tokens generated per measurement (chat: at most, the reply may stop first)
  int repeats = 1;              // measurements per point (median), after a warm-up round
  std::string title;            // the model and machine
};

// "0.85,0.67,0.51" -> rates, checked against K drafts (at most K of them, each in [0, 1],
// non-increasing: the rate of position k is that of keeping drafts 1..k).
std::vector<double> parse_acceptance(const std::string& text, int drafts);

// Random context: prints the table (or JSON) on stdout, a row per depth. fill(state, D) puts D
// tokens of context in a fresh state.
void run_speculative_bench(Backend& backend, const std::vector<int32_t>& depths, const SpeculativeBench& options,
                           const std::function<void(SequenceState&, int32_t)>& fill, bool json);

// The request --chat measures when neither --prompt nor --prompt-file gives one: a sum, which
// lily-tiny (trained on sums of numbers to 999) works out column by column in its thinking
// before the answer, about a hundred tokens, and any chat model answers.
extern const char* const kDefaultBenchPrompt;

// A real prompt to decode from: `text` as the one user message of a chat request, rendered
// through the chat template (thinking on, its default) and tokenized; the reply ends at a stop
// token (<|im_end|>, <|endoftext|>, the generation config's eos ids).
struct ChatContext {
  std::string text;                  // the user message
  std::vector<int32_t> prompt;       // the rendered request's ids, generation prompt included
  std::vector<int32_t> stop_tokens;  // the ids that end the reply
};
ChatContext chat_context(const Tokenizer& tokenizer, const std::vector<int>& eos_token_ids, const std::string& text);

// The user message of --chat: `text` (--prompt), else the contents of `file` (--prompt-file; a
// file that cannot be read throws, naming it), else kDefaultBenchPrompt.
std::string chat_prompt_text(const std::string& text, const std::string& file);

// Chat context: prints the table (or JSON) on stdout, one row; each round decodes from the
// prompt on a fresh state (its prefill not timed).
void run_speculative_bench(Backend& backend, const ChatContext& context, const SpeculativeBench& options, bool json);

}  // namespace lily::cli
