#include "bench/soak.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "bench/serve_client.h"
#include "common/mutex.h"
#include "common/subprocess.h"
#include "http/node_client.h"

namespace pdserve::bench {
namespace {

using std::chrono::milliseconds;

// A port nothing listens on now (the kernel's choice for an ephemeral bind). Another process
// may take it before the child binds; the child then fails to start and the soak says so.
Result<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Status::FromErrno("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  const int err = errno;
  close(fd);
  if (port < 0) return Status::FromErrno("bind 127.0.0.1:0", err);
  return port;
}

std::string Url(int port) { return "http://127.0.0.1:" + std::to_string(port); }

// The value of an unlabelled sample `name` in Prometheus text, or -1.
double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::strtod(line.c_str() + name.size() + 1, nullptr);
  }
  return -1;
}

// One child process of the soak with its fixed argv, restartable.
class Child {
 public:
  Child(std::string name, std::vector<std::string> argv, std::string log_dir)
      : name_(std::move(name)), argv_(std::move(argv)), log_dir_(std::move(log_dir)) {}

  Status Start() {
    SubprocessOptions sp;
    sp.argv = argv_;
    sp.stdin_mode = StdStream::kNull;
    sp.stdout_mode = StdStream::kFile;
    sp.stderr_mode = StdStream::kFile;
    // One log per start, so a crash's last lines are not overwritten by the restart.
    sp.stdout_path = sp.stderr_path = fmt::format("{}/{}.{}.log", log_dir_, name_, starts_++);
    sp.kill_with_parent = true;
    PD_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Spawn(sp));
    process_.emplace(std::move(p));
    return Status::Ok();
  }
  void Kill() {
    if (process_) process_->Kill();
  }
  // SIGTERM, then SIGKILL after `grace`.
  void Stop(Duration grace) {
    if (!process_ || !process_->running()) return;
    (void)process_->Signal(SIGTERM);
    if (!process_->WaitFor(Deadline::After(grace)).ok()) process_->Kill();
  }
  bool running() { return process_ && !process_->TryWait().has_value(); }
  const std::string& name() const { return name_; }

 private:
  const std::string name_;
  const std::vector<std::string> argv_;
  const std::string log_dir_;
  int starts_ = 0;
  std::optional<Subprocess> process_;
};

// Waits until GET /health on `port` answers 200; false if `child` exits or time runs out.
bool WaitHealthy(int port, Child& child, Deadline deadline) {
  while (!deadline.Passed()) {
    if (http::NodeGetOk(http::LocalNode(port), "/health").ok()) return true;
    if (!child.running()) return false;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return false;
}

// The load: `concurrency` threads each sending one streamed request after another.
class Load {
 public:
  Load(const SoakOptions& options, ServerAddress router, std::string model)
      : options_(options), router_(std::move(router)), model_(std::move(model)) {}
  ~Load() { Stop(); }

  void Start() {
    for (int i = 0; i < options_.concurrency; ++i) {
      threads_.emplace_back([this, i] { Loop(i); });
    }
  }
  // Returns once every request in flight has ended (each bounded by the request timeout).
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  void AddTo(SoakReport* report) {
    MutexLock lock(&mu_);
    report->requests += totals_.requests;
    report->completed += totals_.completed;
    report->output_tokens += totals_.output_tokens;
    for (const auto& [k, v] : totals_.well_formed) report->well_formed[k] += v;
    for (const auto& [k, v] : totals_.violations) report->violations[k] += v;
    for (const auto& [k, v] : totals_.example) report->example.emplace(k, v);
  }

 private:
  void Loop(int index) {
    std::mt19937_64 rng(options_.seed * 1000 + static_cast<uint64_t>(index));
    static const char* kPrompts[] = {"Once upon a time", "The little dog",
                                     "In a small town there lived", "Tom and Lily went to the"};
    std::uniform_int_distribution<int> prompt(0, 3), tokens(1, std::max(1, options_.max_tokens));
    while (!stop_) {
      StreamRequest request{EndpointType::kCompletions, model_, kPrompts[prompt(rng)], 0,
                            tokens(rng)};
      Record(StreamCompletion(router_, request, options_.request_timeout));
    }
  }
  void Record(const RequestOutcome& o) {
    MutexLock lock(&mu_);
    ++totals_.requests;
    if (o.success) {
      ++totals_.completed;
      totals_.output_tokens += o.output_tokens;
    } else if (o.failure == FailureKind::kHttpError) {
      ++totals_.well_formed[o.error.substr(0, o.error.find(':'))];  // "HTTP 503"
    } else if (o.failure == FailureKind::kErrorEvent) {
      ++totals_.well_formed["SSE error event"];
    } else {
      const std::string kind = FailureKindName(o.failure);
      ++totals_.violations[kind];
      totals_.example.emplace(kind, o.error.substr(0, 200));
    }
  }

  const SoakOptions& options_;
  const ServerAddress router_;
  const std::string model_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  Mutex mu_;
  SoakReport totals_ GUARDED_BY(mu_);  // only the request counters are used
};

Status Validate(const SoakOptions& o) {
  if (o.pdserve.empty() || o.model_dir.empty() || o.log_dir.empty()) {
    return Status::InvalidArgument("the soak needs the pdserve binary, a model and a log dir");
  }
  if (!(o.seconds > 0)) return Status::InvalidArgument("--seconds must be > 0");
  if (o.concurrency < 1) return Status::InvalidArgument("--concurrency must be >= 1");
  if (o.kill_every <= Duration::zero()) return Status::InvalidArgument("--kill-every must be > 0");
  return Status::Ok();
}

// Polls both nodes' /metrics until every engine is idle or `deadline` passes.
std::vector<SoakNodeState> NodeStates(const std::vector<std::pair<std::string, int>>& nodes,
                                      Deadline deadline) {
  std::vector<SoakNodeState> states;
  while (true) {
    states.clear();
    bool all_idle = true;
    for (const auto& [name, port] : nodes) {
      SoakNodeState s{name, Url(port)};
      if (Result<std::string> text = http::NodeGetOk(http::LocalNode(port), "/metrics");
          text.ok()) {
        s.reachable = true;
        s.running = MetricValue(*text, "pdserve:num_requests_running");
        s.waiting = MetricValue(*text, "pdserve:num_requests_waiting");
        s.kv_cache_usage = MetricValue(*text, "pdserve:kv_cache_usage_perc");
      }
      all_idle = all_idle && s.idle();
      states.push_back(s);
    }
    if (all_idle || deadline.Passed()) return states;
    std::this_thread::sleep_for(milliseconds(200));
  }
}

}  // namespace

bool SoakReport::passed() const {
  if (!aborted.empty() || completed == 0) return false;
  for (const auto& [kind, n] : violations) {
    if (n > 0) return false;
  }
  for (const SoakNodeState& node : nodes) {
    if (!node.idle()) return false;
  }
  return true;
}

Result<SoakReport> RunSoak(const SoakOptions& options) {
  PD_RETURN_IF_ERROR(Validate(options));
  PD_ASSIGN_OR_RETURN(const int port_a, FreePort());
  PD_ASSIGN_OR_RETURN(const int port_b, FreePort());
  PD_ASSIGN_OR_RETURN(const int port_router, FreePort());
  auto node_argv = [&](int port) {
    return std::vector<std::string>{options.pdserve, "serve",
                                    "--role",        "colocated",
                                    "--model",       options.model_dir,
                                    "--listen",      "127.0.0.1:" + std::to_string(port),
                                    "--threads",     std::to_string(options.node_threads),
                                    "--kv-cache-mb", "64"};
  };
  Child node_a("node-A", node_argv(port_a), options.log_dir);
  Child node_b("node-B", node_argv(port_b), options.log_dir);
  // Health checks every 250 ms, one failure marks a node down: the router notices the kills
  // quickly; its retries must cover the rest.
  Child router("router",
               {options.pdserve, "router", "--listen", "127.0.0.1:" + std::to_string(port_router),
                "--node", Url(port_a), "--node", Url(port_b), "--health-interval-ms", "250",
                "--failures-to-down", "1"},
               options.log_dir);
  const Duration startup = std::chrono::seconds(120);
  PD_RETURN_IF_ERROR(node_a.Start());
  PD_RETURN_IF_ERROR(node_b.Start());
  PD_RETURN_IF_ERROR(router.Start());
  for (auto [child, port] :
       {std::pair<Child*, int>{&node_a, port_a}, {&node_b, port_b}, {&router, port_router}}) {
    if (!WaitHealthy(port, *child, Deadline::After(startup))) {
      return Status::Unavailable(child->name() + " did not become healthy; see its log in " +
                                 options.log_dir);
    }
  }
  std::this_thread::sleep_for(milliseconds(600));  // two health rounds: both nodes up

  // The model name the nodes serve.
  std::string model = "default";
  if (Result<std::string> models = http::NodeGetOk(http::LocalNode(port_a), "/v1/models");
      models.ok()) {
    const auto j = nlohmann::json::parse(*models, nullptr, false);
    if (!j.is_discarded() && j.contains("data") && !j["data"].empty()) {
      model = j["data"][0].value("id", model);
    }
  }

  SoakReport report;
  report.concurrency = options.concurrency;
  PD_ASSIGN_OR_RETURN(ServerAddress router_address, ParseBaseUrl(Url(port_router)));
  const TimePoint start = Clock::now();
  const TimePoint end =
      start + std::chrono::duration_cast<Duration>(std::chrono::duration<double>(options.seconds));
  {
    Load load(options, router_address, model);
    load.Start();
    while (Clock::now() + options.kill_every < end) {
      std::this_thread::sleep_for(options.kill_every);
      node_b.Kill();
      ++report.kills;
      std::this_thread::sleep_for(options.down_for);
      if (Status s = node_b.Start(); !s.ok()) {
        report.aborted = "restarting node B: " + s.ToString();
        break;
      }
      if (!WaitHealthy(port_b, node_b, Deadline::After(startup))) {
        report.aborted = "node B did not come back healthy; see " + options.log_dir;
        break;
      }
      ++report.restarts;
    }
    std::this_thread::sleep_until(end);
    load.Stop();
    load.AddTo(&report);
  }
  report.seconds = SecondsSince(start);
  report.nodes =
      NodeStates({{"A", port_a}, {"B", port_b}}, Deadline::After(std::chrono::seconds(15)));
  router.Stop(std::chrono::seconds(10));
  node_a.Stop(std::chrono::seconds(10));
  node_b.Stop(std::chrono::seconds(10));
  return report;
}

std::string FormatSoakReport(const SoakReport& r) {
  std::string out = fmt::format(
      "{:=^64}\nRouter + 2 nodes, {} concurrent streams, {:.1f} s; node B SIGKILLed {} times, "
      "restarted {}\n",
      " Soak Result ", r.concurrency, r.seconds, r.kills, r.restarts);
  auto row = [&out](const std::string& what, long long n) {
    out += fmt::format("{:<50}{:>14}\n", what, n);
  };
  row("Requests:", r.requests);
  row("Completed with data: [DONE]:", r.completed);
  row("Output tokens of completed requests:", r.output_tokens);
  for (const auto& [what, n] : r.well_formed) row("Well-formed error, " + what + ":", n);
  int violations = 0;
  for (const auto& [kind, n] : r.violations) {
    row("VIOLATION " + kind + ":", n);
    violations += n;
  }
  row("Violations:", violations);
  for (const auto& [kind, message] : r.example) {
    out += fmt::format("  first {}: {}\n", kind, message);
  }
  out += fmt::format("{:-^64}\n{:<6}{:<26}{:>10}{:>10}{:>12}\n", " Nodes after the load ", "node",
                     "url", "running", "waiting", "kv pages");
  for (const SoakNodeState& n : r.nodes) {
    if (!n.reachable) {
      out += fmt::format("{:<6}{:<26}{:>32}\n", n.name, n.url, "unreachable");
      continue;
    }
    out += fmt::format("{:<6}{:<26}{:>10}{:>10}{:>11.1f}%\n", n.name, n.url, n.running, n.waiting,
                       n.kv_cache_usage * 100);
  }
  if (!r.aborted.empty()) out += "Aborted: " + r.aborted + "\n";
  out += fmt::format("{:=^64}\nVerdict: {}\n", "", r.passed() ? "PASS" : "FAIL");
  return out;
}

}  // namespace pdserve::bench
