// RequestDrain: one request's life on a node from Submit to its last output, and the ONE loop
// that reads the engine's outputs for it, used alike by streamed and whole responses. It
// submits with an OutputChannel, waits on it one poll slice at a time (so handlers notice a
// stopping server), keeps the idle deadline, records latency metrics, and keeps the request
// counted live (Stop cancels it) and waiting for its first token (the overload limit).
// Destroying it cancels the engine request if the engine had not finished it (client gone,
// deadline, handler error).
//
// LiveRequests is thread-safe. A RequestDrain is thread-compatible: one handler thread uses
// it (for streams, httplib calls the content provider from one thread at a time).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "engine/engine.h"
#include "engine/request.h"
#include "http/api_error.h"
#include "server/metrics.h"
#include "server/output_channel.h"

namespace pdserve::server {

// The node's requests between submission and their end.
class LiveRequests {
 public:
  // Adds `id`, counted as waiting for its first output.
  void Add(const std::string& id) EXCLUDES(mu_);
  // Removes `id`; `still_waiting` says whether it never got a first output.
  void Remove(const std::string& id, bool still_waiting) EXCLUDES(mu_);
  // One request got its first output.
  void FirstOutput() { waiting_.fetch_sub(1); }
  int waiting() const { return waiting_.load(); }
  std::vector<std::string> Ids() const EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  std::set<std::string> ids_ GUARDED_BY(mu_);
  std::atomic<int> waiting_{0};
};

// What every drain of a node shares. Every pointer outlives the drains.
struct DrainContext {
  Engine* engine = nullptr;
  ServerMetrics* metrics = nullptr;
  LiveRequests* live = nullptr;
  const std::atomic<bool>* stopping = nullptr;
  Duration idle_timeout = std::chrono::seconds(600);  // no output this long: give up
};

class RequestDrain {
 public:
  // Registers `id` live at once, so a Stop() racing the submission still cancels it.
  RequestDrain(const DrainContext& node, std::string id);
  ~RequestDrain();
  RequestDrain(const RequestDrain&) = delete;
  RequestDrain& operator=(const RequestDrain&) = delete;

  // Submits `request` under this drain's id; its outputs go to this drain. `via`, when set,
  // submits instead of the engine (a decode node's KV messenger, for remote prefill).
  Status Submit(EngineRequest request, const std::function<Status(EngineRequest)>& via = nullptr);

  enum class Step {
    kOutputs,     // *outputs holds new outputs (metrics recorded; finished() updated)
    kNothingYet,  // a poll slice passed with no output: call again
    kTimedOut,    // no output for idle_timeout: the caller answers 504
  };
  // Waits at most one poll slice. Precondition: Submit succeeded and !finished().
  Step Next(std::vector<RequestOutput>* outputs);

  bool finished() const { return finished_; }
  const std::string& id() const { return id_; }

 private:
  void Record(const RequestOutput& out);

  const DrainContext node_;
  const std::string id_;
  std::shared_ptr<OutputChannel> channel_ = std::make_shared<OutputChannel>();
  Deadline idle_ = Deadline::Never();
  bool submitted_ = false;
  bool first_output_ = false;
  bool finished_ = false;
  // Latency bookkeeping.
  TimePoint arrival_ = Clock::now();
  TimePoint last_token_{};
};

// What a client sees of a request the engine ended without success: the engine's error, or
// 503 "cancelled" (the server stopping); nullopt for kStop/kLength.
std::optional<http::ApiError> FinishError(const RequestOutput& out);
// 504 for a request with no output within the request timeout.
http::ApiError IdleTimeoutError();

}  // namespace pdserve::server
