// Helpers of the membership tests (docs/architecture.md, "Membership"): a real etcd server
// (Debian's etcd-server), "hosts" — network namespaces joined by veth pairs to one bridge, each
// running its own processes — and `pdserve` processes started on a host. Without etcd, or
// without the rights to make namespaces (root / CAP_NET_ADMIN), the tests are SKIPPED, loudly.
// Used from the test's main thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/subprocess.h"

namespace pdserve::testing {

// The etcd binary ("" if not installed).
std::string EtcdPath();
// The `ip` binary of iproute2 ("" if not installed).
std::string IpToolPath();
// Runs `ip <args>`; its exit status (127 if it could not run).
int RunIpTool(const std::vector<std::string>& args);

// A place processes run: a network namespace with its own address on the test bridge, or this
// namespace's loopback (ns empty).
struct Host {
  std::string ns;
  std::string ip = "127.0.0.1";
  std::string link;  // the bridge side of its veth pair (down: the host is cut off)
};

// `argv` run on `host` (through `ip netns exec`).
std::vector<std::string> OnHost(const Host& host, std::vector<std::string> argv);

// A bridge and namespaces on it; everything is removed on destruction (kill the processes
// first). Create returns "" or why it could not (the caller skips).
class TestHosts {
 public:
  TestHosts();
  ~TestHosts();
  TestHosts(const TestHosts&) = delete;
  TestHosts& operator=(const TestHosts&) = delete;
  std::string CreateBridge();
  // Host k (1..250) on the bridge; "" or why not.
  std::string Add(int k, Host* host);
  // Cuts (or restores) a host's link.
  bool SetLink(const Host& host, bool up);

 private:
  int id_ = 0;
  std::string bridge_;
  std::string subnet_;  // "10.217.N."
  std::vector<std::string> namespaces_;
  std::vector<std::string> links_;
};

// A real etcd on `host`, its data in a directory of its own (kept across Kill/Start so that
// a restarted server has the same keys and leases).
class EtcdProcess {
 public:
  explicit EtcdProcess(Host host);
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;
  // Starts it and waits (20 s) until it answers; false with the reason in *error.
  bool Start(std::string* error);
  void Kill();  // SIGKILL, reaped
  std::string url() const;

 private:
  Host host_;
  std::string dir_;
  int client_port_ = 2379;
  int peer_port_ = 2380;
  std::optional<pdserve::Subprocess> process_;
};

// A `pdserve` process on a host.
class HostProcess {
 public:
  HostProcess() = default;
  HostProcess(const HostProcess&) = delete;
  HostProcess& operator=(const HostProcess&) = delete;
  // `pdserve serve --listen IP:PORT --model TINY <args>` (port 0: any free one); waits (60 s)
  // for its ready line.
  bool StartServe(const Host& host, const std::vector<std::string>& args, std::string* error,
                  int port = 0);
  // `pdserve router --listen 127.0.0.1:PORT <args>` in this namespace; waits (30 s) for
  // /metrics to answer.
  bool StartRouter(const std::vector<std::string>& args, std::string* error);
  void Kill();  // SIGKILL, reaped
  // Waits for it to end by itself: its exit code (128 + signal), or -1 at the deadline.
  int Wait(int timeout_ms);
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  int port() const { return port_; }
  const std::string& ip() const { return ip_; }
  std::string url() const { return "http://" + ip_ + ":" + std::to_string(port_); }

 private:
  std::optional<pdserve::Subprocess> process_;
  std::string ip_;
  int port_ = 0;
};

// A metric of the process at ip:port (-1 if absent or it does not answer).
double MetricAt(const std::string& ip, int port, const std::string& name);
// Polls until `pred(value)` holds (deadline ms); the last value seen.
template <typename Pred>
double WaitForMetricAt(const std::string& ip, int port, const std::string& name, Pred pred,
                       int deadline_ms);
// GET path's body at ip:port ("" if no 200).
std::string GetBodyAt(const std::string& ip, int port, const std::string& path);

}  // namespace pdserve::testing

#include <chrono>
#include <thread>

namespace pdserve::testing {

template <typename Pred>
double WaitForMetricAt(const std::string& ip, int port, const std::string& name, Pred pred,
                       int deadline_ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  double seen = MetricAt(ip, port, name);
  while (!pred(seen) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    seen = MetricAt(ip, port, name);
  }
  return seen;
}

}  // namespace pdserve::testing
