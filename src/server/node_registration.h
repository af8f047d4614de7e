// NodeRegistration: keeps a node registered with a router by POSTing its registration body
// ({"url": "<node url>"}, http/registration_body.h) to <router>/internal/register every few
// seconds from its own thread.
// Failures are logged (once per change), never fatal. Construct and destroy from one thread;
// the destructor stops the thread promptly.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"

namespace pdserve::server {

class NodeRegistration {
 public:
  // `cluster_key` signs each registration (the router refuses unsigned ones). `path`: where on
  // `router_url` to register (a decode node takes prefill nodes at /internal/messenger/join).
  NodeRegistration(std::string router_url, std::string node_url, std::string cluster_key,
                   std::chrono::milliseconds interval = std::chrono::seconds(5),
                   std::string path = "/internal/register");
  ~NodeRegistration();
  NodeRegistration(const NodeRegistration&) = delete;
  NodeRegistration& operator=(const NodeRegistration&) = delete;

 private:
  void Run() EXCLUDES(mu_);
  // Ok, or why the router did not take the registration (unreachable, HTTP status and body).
  Status RegisterOnce();
  // Waits until the destructor asks to stop or `deadline` passes; true if asked to stop.
  bool StopRequestedBy(TimePoint deadline) EXCLUDES(mu_);

  const std::string router_url_;
  const std::string node_url_;
  const std::string cluster_key_;
  const std::string path_;
  const std::chrono::milliseconds interval_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pdserve::server
