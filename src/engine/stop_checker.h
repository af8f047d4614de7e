// StopChecker: decides after each generated token whether a sequence ends, and why (EOS or a
// stop token or stop string => "stop", max_tokens => "length"), and how much of the output
// text is safe to stream now.
// One per sequence; thread-compatible (driven by the engine loop that samples the sequence).
//
// Text semantics follow OpenAI: a stop string is matched in the detokenised output (also when
// it spans several tokens) and is not part of the returned text, nor is anything after it.
// The text of a stopping token (EOS, stop_token_ids) is not returned either. While streaming,
// a tail of the text that could still grow into a stop string is held back until it either
// completes one (and is dropped) or cannot any more (and is released).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "engine/sampling_params.h"

namespace pdserve {

struct StopDecision {
  bool stop = false;
  FinishReason reason = FinishReason::kNone;  // kStop or kLength when stop
  // Text to send to the client now. On a stop it is the last of the text (cut before the
  // stop string); concatenating every emit (and Flush()) gives text().
  std::string emit;
};

class StopChecker {
 public:
  // eos_ids: the model's end-of-sequence ids (tokenizer and generation config), honoured
  // unless params.ignore_eos. Precondition: params.Validate() is ok.
  StopChecker(const SamplingParams& params, std::span<const int32_t> eos_ids);

  // Call once per generated token with the text it completed (IncrementalDecoder::Append).
  // Checks, in order: stop token (EOS / stop_token_ids), stop strings, max_tokens. After a
  // stop, further calls return the same stop with nothing to emit.
  StopDecision Update(int32_t token, std::string_view new_text);

  // Ends the text when the sequence finishes for a reason decided elsewhere (context full,
  // cancel) or after a "length" stop: appends `tail` (e.g. IncrementalDecoder::Flush()),
  // still cutting at a stop string, and returns everything not yet emitted. After a "stop"
  // the tail is dropped and "" returned. Later Update() calls emit nothing.
  std::string Flush(std::string_view tail = {});

  bool stopped() const { return reason_ != FinishReason::kNone; }
  FinishReason reason() const { return reason_; }
  // The output text so far (cut before a matched stop string), emitted or held back.
  const std::string& text() const { return text_; }
  int num_tokens() const { return num_tokens_; }
  // Bytes of text() held back because they may begin a stop string.
  size_t held_back() const { return text_.size() - emitted_; }

 private:
  // Knuth-Morris-Pratt matcher of one stop string, fed byte by byte across tokens.
  struct Matcher {
    std::string pattern;
    std::vector<int> fallback;  // fallback[i]: longest proper border of pattern[0..i]
    int matched = 0;            // longest prefix of pattern that is a suffix of the text
  };

  bool IsStopToken(int32_t token) const;
  // Appends s to text_, advancing the matchers. Returns where the first stop string to
  // complete starts in text_ (text_ then ends right after it), or npos.
  size_t AppendAndMatch(std::string_view s);
  // Text from emitted_ to `end`, marked emitted.
  std::string TakeUntil(size_t end);
  StopDecision Stop(FinishReason reason, std::string emit);

  int max_tokens_;
  std::vector<int32_t> stop_tokens_;  // EOS (unless ignored) and stop_token_ids
  std::vector<Matcher> matchers_;
  std::string text_;
  size_t emitted_ = 0;
  int num_tokens_ = 0;
  FinishReason reason_ = FinishReason::kNone;
  bool flushed_ = false;
};

}  // namespace pdserve
