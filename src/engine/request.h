// What a caller gives the engine (EngineRequest) and what it gets back (RequestOutput).
// Plain value types; thread-compatible. Callbacks run on the engine's loop thread and must
// not block (post to your own queue if you need to do I/O).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"
#include "kv/layout.h"

namespace pdserve {

enum class FinishReason : uint8_t {
  kNone = 0,   // still running
  kStop,       // EOS, a stop token or a stop string
  kLength,     // max_tokens or the model's context
  kCancelled,  // Cancel() or engine shutdown
  kError,      // see RequestOutput::status
  kPrefilled,  // prefill-only request: the prompt's KV is in its pages
};
const char* FinishReasonName(FinishReason r);  // "stop", "length", "cancelled", ...

struct RequestOutput;

enum class RequestKind : uint8_t {
  // Prefill then decode in this engine (colocated, and the decode side once admitted).
  kGenerate,
  // Prefill the prompt only and never sample (a prefill node). The request finishes with
  // kPrefilled; its pages stay allocated until ReleaseHeldPages(id), also when it ends
  // otherwise (cancelled, failed) after pages were allocated, and it is never preempted: the
  // caller may have posted writes that read them.
  kPrefillOnly,
  // Decode side of a disaggregated request: the engine allocates pages for the prompt, hands
  // them to on_pages_allocated, and keeps the request out of scheduling until Admit(id) says
  // the KV of positions [0, prompt.size() - 1) has landed; its first step runs the last
  // prompt token.
  kRemotePrefill,
};

struct EngineRequest {
  std::string id;  // unique among live requests
  std::vector<int32_t> prompt;
  SamplingParams params;
  RequestKind kind = RequestKind::kGenerate;
  // Called for every batch of new tokens and once with finished == true. Required.
  std::function<void(const RequestOutput&)> on_output;
  // kRemotePrefill only: the request's pages (in token order); the first `cached_pages` came
  // from this engine's prefix cache and already hold their KV (shared and sealed: nothing may
  // write them), the rest must be written.
  std::function<void(const std::vector<PageId>& pages, int cached_pages)> on_pages_allocated;
};

struct RequestOutput {
  std::string id;
  std::vector<int32_t> tokens;        // new tokens of this step (usually one)
  std::string text;                   // new text safe to show (stop strings held back / cut)
  std::vector<SampleResult> samples;  // per new token: logprob and top alternatives
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Status status;  // non-ok with kError
  int prompt_tokens = 0;
  int completion_tokens = 0;       // total so far
  std::vector<PageId> held_pages;  // kPrefillOnly, when finished: pages still allocated
  // kPrefillOnly on a model with its MTP KV layer, when finished: the final-normed hidden state
  // of the last prompt position, where the decode node's MTP drafts start (Engine::Admit).
  std::vector<float> mtp_hidden;
};

}  // namespace pdserve
