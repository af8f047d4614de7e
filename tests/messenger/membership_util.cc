#include "membership_util.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <httplib.h>

#include "disagg_util.h"
#include "http/cluster_auth.h"
#include "http/etcd_client.h"
#include "testing/cluster_processes.h"
#include "testing/node_process.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

std::string FirstExecutable(const std::vector<const char*>& paths) {
  for (const char* path : paths) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

// A directory of its own for a process's data and log.
std::string FreshDir(const std::string& what) {
  std::string pattern =
      (std::filesystem::temp_directory_path() / ("pdserve-" + what + "-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

}  // namespace

std::string EtcdPath() { return FirstExecutable({"/usr/bin/etcd", "/usr/local/bin/etcd"}); }

std::string IpToolPath() {
  return FirstExecutable({"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"});
}

int RunIpTool(const std::vector<std::string>& args) {
  SubprocessOptions options;
  options.argv = {IpToolPath()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.stdout_mode = StdStream::kNull;
  options.stderr_mode = StdStream::kNull;
  auto process = pdserve::Subprocess::Spawn(options);
  if (!process.ok()) return 127;
  auto status = process->WaitFor(Deadline::AfterMs(30000));
  if (!status.ok()) return 127;
  return status->exited() ? status->code : 128;
}

std::vector<std::string> OnHost(const Host& host, std::vector<std::string> argv) {
  if (host.ns.empty()) return argv;
  std::vector<std::string> out = {IpToolPath(), "netns", "exec", host.ns};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

TestHosts::TestHosts() {
  // Names of their own per test process and per fixture: the kernel may still be tearing down
  // the previous test's pairs.
  static int instance = 0;
  id_ = (getpid() % 10000) * 10 + (instance++ % 10);
}

TestHosts::~TestHosts() {
  // The pairs first (synchronous), then the namespaces.
  for (const std::string& link : links_) RunIpTool({"link", "del", link});
  for (const std::string& ns : namespaces_) RunIpTool({"netns", "del", ns});
  if (!bridge_.empty()) RunIpTool({"link", "del", bridge_});
}

std::string TestHosts::CreateBridge() {
  if (IpToolPath().empty()) return "the hosts need iproute2 (`ip`)";
  // A subnet of its own per test process, so that two runs at once do not share a route.
  subnet_ = fmt::format("10.217.{}.", id_ % 250);
  const std::string bridge = fmt::format("pdmb{}", id_);
  if (RunIpTool({"link", "add", bridge, "type", "bridge"}) != 0) {
    return "cannot create a bridge: `ip link add " + bridge +
           " type bridge` failed (needs root / CAP_NET_ADMIN)";
  }
  bridge_ = bridge;
  if (RunIpTool({"addr", "add", subnet_ + "254/24", "dev", bridge}) != 0 ||
      RunIpTool({"link", "set", bridge, "up"}) != 0) {
    return "cannot bring the bridge " + bridge + " up";
  }
  return "";
}

std::string TestHosts::Add(int k, Host* host) {
  host->ns = fmt::format("pdm{}h{}", id_, k);
  host->ip = subnet_ + std::to_string(k);
  host->link = fmt::format("pdm{}b{}", id_, k);
  const std::string inside = fmt::format("pdm{}n{}", id_, k);
  if (RunIpTool({"netns", "add", host->ns}) != 0) {
    return "cannot create the network namespace " + host->ns;
  }
  namespaces_.push_back(host->ns);
  if (RunIpTool({"link", "add", host->link, "type", "veth", "peer", "name", inside}) != 0) {
    return "`ip link add " + host->link + " type veth peer name " + inside + "` failed";
  }
  links_.push_back(host->link);
  const std::vector<std::vector<std::string>> steps = {
      {"link", "set", inside, "netns", host->ns},
      {"link", "set", host->link, "master", bridge_},
      {"link", "set", host->link, "up"},
      {"-n", host->ns, "addr", "add", host->ip + "/24", "dev", inside},
      {"-n", host->ns, "link", "set", inside, "up"},
      {"-n", host->ns, "link", "set", "lo", "up"},
  };
  for (const auto& step : steps) {
    if (RunIpTool(step) != 0) {
      std::string text;
      for (const auto& s : step) text += " " + s;
      return "`ip" + text + "` failed";
    }
  }
  return "";
}

bool TestHosts::SetLink(const Host& host, bool up) {
  return RunIpTool({"link", "set", host.link, up ? "up" : "down"}) == 0;
}

EtcdProcess::EtcdProcess(Host host) : host_(std::move(host)), dir_(FreshDir("etcd")) {
  if (host_.ns.empty()) {
    client_port_ = FreePort();
    peer_port_ = FreePort();
  }
}

EtcdProcess::~EtcdProcess() {
  Kill();
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

std::string EtcdProcess::url() const {
  return "http://" + host_.ip + ":" + std::to_string(client_port_);
}

bool EtcdProcess::Start(std::string* error) {
  const std::string peer = "http://" + host_.ip + ":" + std::to_string(peer_port_);
  SubprocessOptions options;
  options.argv = OnHost(
      host_, {EtcdPath(), "--name", "t", "--data-dir", dir_ + "/data", "--listen-client-urls",
              url(), "--advertise-client-urls", url(), "--listen-peer-urls", peer,
              "--initial-advertise-peer-urls", peer, "--initial-cluster", "t=" + peer});
  options.stdout_mode = StdStream::kFile;
  options.stdout_path = dir_ + "/etcd.log";
  options.stderr_mode = StdStream::kFile;
  options.stderr_path = dir_ + "/etcd.stderr.log";
  auto process = pdserve::Subprocess::Spawn(options);
  if (!process.ok()) {
    *error = "etcd: " + process.status().ToString();
    return false;
  }
  process_ = std::move(*process);
  http::EtcdClient client({url()});
  const Deadline deadline = Deadline::AfterMs(20000);
  while (!deadline.Passed()) {
    if (client.RangePrefix("/").ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  *error = "etcd at " + url() + " did not answer within 20 s (log: " + dir_ + ")";
  return false;
}

void EtcdProcess::Kill() {
  if (process_) {
    process_->Kill();
    process_.reset();
  }
}

bool HostProcess::StartServe(const Host& host, const std::vector<std::string>& args,
                             std::string* error, int port) {
  ip_ = host.ip;
  std::vector<std::string> argv = {BinaryPath("src/cli/pdserve"),        "serve",   "--listen",
                                   host.ip + ":" + std::to_string(port), "--model", TinyModelDir()};
  argv.insert(argv.end(), args.begin(), args.end());
  SubprocessOptions options;
  options.argv = OnHost(host, argv);
  options.stdout_mode = StdStream::kPipe;
  auto process = pdserve::Subprocess::Spawn(options);
  if (!process.ok()) {
    *error = process.status().ToString();
    return false;
  }
  process_ = std::move(*process);
  const std::string marker = "ready on http://" + host.ip + ":";
  const Deadline deadline = Deadline::AfterMs(60000);
  while (true) {
    auto line = process_->ReadLine(deadline);
    if (!line.ok()) break;
    if (const size_t at = line->find(marker); at != std::string::npos) {
      port_ = std::atoi(line->c_str() + at + marker.size());
      return port_ > 0;
    }
  }
  *error = "pdserve serve on " + host.ip + " did not get ready";
  return false;
}

bool HostProcess::StartRouter(const std::vector<std::string>& args, std::string* error) {
  ip_ = "127.0.0.1";
  port_ = FreePort();
  std::vector<std::string> argv = {BinaryPath("src/cli/pdserve"), "router", "--listen",
                                   "127.0.0.1:" + std::to_string(port_)};
  argv.insert(argv.end(), args.begin(), args.end());
  SubprocessOptions options;
  options.argv = argv;
  auto process = pdserve::Subprocess::Spawn(options);
  if (!process.ok()) {
    *error = process.status().ToString();
    return false;
  }
  process_ = std::move(*process);
  const Deadline deadline = Deadline::AfterMs(30000);
  while (!deadline.Passed()) {
    if (MetricAt(ip_, port_, "pdserve:router_nodes") >= 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  *error = "the router did not answer /metrics";
  return false;
}

void HostProcess::Kill() {
  if (process_) {
    process_->Kill();
    process_.reset();
  }
}

int HostProcess::Wait(int timeout_ms) {
  if (!process_) return -1;
  auto status = process_->WaitFor(Deadline::AfterMs(timeout_ms));
  if (!status.ok()) return -1;
  return status->exited() ? status->code : 128 + status->signal;
}

double MetricAt(const std::string& ip, int port, const std::string& name) {
  httplib::Client client(ip, port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) return -1;
  return MetricValue(res->body, name);
}

std::string GetBodyAt(const std::string& ip, int port, const std::string& path) {
  httplib::Client client(ip, port);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(5, 0);
  // /internal/ routes answer only to a proof of the cluster secret.
  httplib::Headers headers;
  if (path.starts_with(http::kInternalPathPrefix)) {
    headers = http::ClusterAuthHeaders(kClusterKey, "GET", path);
  }
  auto res = client.Get(path, headers);
  if (!res || res->status != 200) return "";
  return res->body;
}

}  // namespace pdserve::testing
