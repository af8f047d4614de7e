// Test helpers that run the real `pdserve` binary: a `pdserve serve` child process on a free
// port, `pdserve generate --json` as the reference, and an SSE reader (the model directory comes
// from testing/test_models.h). For tests only; each object is used from the test's main thread
// except Post/Stream helpers, which are safe from any thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "common/subprocess.h"
#include "testing/test_models.h"

namespace pdserve::testing {

// Runs `pdserve <args>` to completion (deadline 120 s) and returns its stdout; the exit code
// goes to *exit_code.
std::string RunPdserve(const std::vector<std::string>& args, int* exit_code);

// How a NodeProcess is started beyond its flags.
struct NodeLaunch {
  std::string listen = "127.0.0.1:0";                    // any free port unless given
  std::vector<std::pair<std::string, std::string>> env;  // on top of this process's environment
  std::string log_path;  // stderr (the log) to this file; empty: this process's stderr
  // Its own process group (pgid = its pid), which its children (rank workers) share: Signal
  // with group reaches them all, as a terminal's Ctrl-C would; destruction kills the group.
  bool own_process_group = false;
};

class NodeProcess {
 public:
  // Starts `pdserve serve --listen LISTEN --model DIR <extra>` and waits (30 s) for its "ready
  // on" line. On failure, ok() is false and error() says why.
  NodeProcess(const std::string& model_dir, const std::vector<std::string>& extra_args,
              const NodeLaunch& launch);
  // The same with `listen` (a restarted node reuses its predecessor's address) and `env`.
  NodeProcess(const std::string& model_dir, const std::vector<std::string>& extra_args,
              const std::string& listen = "127.0.0.1:0",
              const std::vector<std::pair<std::string, std::string>>& env = {});
  NodeProcess(const NodeProcess&) = delete;
  NodeProcess& operator=(const NodeProcess&) = delete;
  // Kills the node and its rank workers, and removes the shm region files they leave (a
  // SIGKILLed process cannot; they would pile up in /dev/shm run after run).
  ~NodeProcess();

  bool ok() const { return port_ > 0; }
  const std::string& error() const { return error_; }
  int port() const { return port_; }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  httplib::Client Client() const;
  // Sends SIGTERM and waits up to timeout_ms; returns the exit status, or -1 on timeout.
  int Terminate(int timeout_ms);
  // Sends `sig` to the node, or to its process group (needs own_process_group).
  Status Signal(int sig, bool group = false);
  // Waits up to timeout_ms for the node to end by itself; its exit code (128 + signal if a
  // signal ended it), or -1 on timeout.
  int Wait(int timeout_ms);

 private:
  std::optional<Subprocess> process_;  // killed and reaped on destruction
  int port_ = 0;
  std::string error_;
};

// One streamed response: the JSON of every "data:" event before [DONE], and whether [DONE]
// came last.
struct SseStream {
  int status = 0;
  std::string content_type;
  std::vector<nlohmann::json> events;
  bool done = false;
  std::string raw;
  std::string error;  // the client's error when the exchange failed
};

// POSTs body to path and reads the SSE stream to its end. stop_after_events > 0 closes the
// connection after that many events (a client that goes away mid-stream).
SseStream PostStream(int port, const std::string& path, const nlohmann::json& body,
                     int stop_after_events = 0, const httplib::Headers& headers = {});

// The metric value of the first line starting with `name` (name plus labels, space, value);
// -1 if absent.
double MetricValue(const std::string& metrics_text, const std::string& name);

}  // namespace pdserve::testing
