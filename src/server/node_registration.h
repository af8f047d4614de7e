// NodeRegistration: keeps a node registered with a router by POSTing
// {"url": "<node url>"} to <router>/internal/register every few seconds from its own thread.
// Failures are logged (once per change), never fatal. Construct and destroy from one thread;
// the destructor stops the thread promptly.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace pdserve::server {

class NodeRegistration {
 public:
  NodeRegistration(std::string router_url, std::string node_url,
                   std::chrono::milliseconds interval = std::chrono::seconds(5));
  ~NodeRegistration();
  NodeRegistration(const NodeRegistration&) = delete;
  NodeRegistration& operator=(const NodeRegistration&) = delete;

 private:
  void Run();
  bool RegisterOnce();

  const std::string router_url_;
  const std::string node_url_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace pdserve::server
