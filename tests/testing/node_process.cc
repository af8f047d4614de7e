#include "testing/node_process.h"

#include <signal.h>

#include <cstdlib>

#include "testing/processes.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

// The pdserve binary with `args`, stdout on a pipe (stderr the test's unless launched with a
// log path).
Result<Subprocess> Spawn(const std::vector<std::string>& args, const NodeLaunch& launch = {}) {
  SubprocessOptions options;
  options.env = launch.env;
  options.argv = {BinaryPath("src/cli/pdserve")};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.stdout_mode = StdStream::kPipe;
  if (!launch.log_path.empty()) {
    options.stderr_mode = StdStream::kFile;
    options.stderr_path = launch.log_path;
  }
  options.new_process_group = launch.own_process_group;
  return Subprocess::Spawn(options);
}

// The exit code, or 128 + signal.
int ExitCode(const ExitStatus& status) {
  return status.exited() ? status.code : 128 + status.signal;
}

}  // namespace

std::string RunPdserve(const std::vector<std::string>& args, int* exit_code) {
  *exit_code = -1;
  auto process = Spawn(args);
  if (!process.ok()) return "";
  auto out = process->ReadAll(Deadline::AfterMs(120000));
  if (!out.ok()) return "";  // the destructor kills the hung child
  auto status = process->WaitFor(Deadline::AfterMs(10000));
  if (status.ok()) *exit_code = ExitCode(*status);
  return *out;
}

NodeProcess::NodeProcess(const std::string& model_dir, const std::vector<std::string>& extra_args,
                         const std::string& listen,
                         const std::vector<std::pair<std::string, std::string>>& env)
    : NodeProcess(model_dir, extra_args, [&] {
        NodeLaunch launch;
        launch.listen = listen;
        launch.env = env;
        return launch;
      }()) {}

NodeProcess::NodeProcess(const std::string& model_dir, const std::vector<std::string>& extra_args,
                         const NodeLaunch& launch) {
  std::vector<std::string> args = {"serve", "--listen", launch.listen, "--model", model_dir};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto process = Spawn(args, launch);
  if (!process.ok()) {
    error_ = "cannot spawn pdserve: " + process.status().ToString();
    return;
  }
  process_ = std::move(*process);
  const Deadline deadline = Deadline::AfterMs(30000);
  std::string out;
  const std::string marker = "ready on http://127.0.0.1:";
  while (true) {
    auto line = process_->ReadLine(deadline);
    if (!line.ok()) break;
    out += *line + "\n";
    const size_t at = line->find(marker);
    if (at != std::string::npos && line->find(' ', at + marker.size()) != std::string::npos) {
      port_ = std::atoi(line->c_str() + at + marker.size());
      return;
    }
  }
  error_ = "pdserve serve did not get ready; stdout: " + out;
}

httplib::Client NodeProcess::Client() const {
  httplib::Client c("127.0.0.1", port_);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(60, 0);
  c.set_write_timeout(10, 0);
  return c;
}

NodeProcess::~NodeProcess() {
  if (!process_ || !process_->running()) return;  // reaped: its pid may be another's by now
  // Alive or an unreaped zombie: neither its pid nor, while it lives, its workers' can be
  // reused yet. A worker already gone keeps its files (its pid is unknown here).
  std::vector<pid_t> pids = ChildrenOf(process_->pid());
  pids.push_back(process_->pid());
  for (pid_t pid : pids) RemoveShmRegionsOf(pid);
  process_.reset();
}

int NodeProcess::Terminate(int timeout_ms) {
  if (!Signal(SIGTERM).ok()) return -1;
  return Wait(timeout_ms);
}

Status NodeProcess::Signal(int sig, bool group) {
  if (!process_) return Status::FailedPrecondition("the node was never started");
  return process_->Signal(sig, group);
}

int NodeProcess::Wait(int timeout_ms) {
  if (!process_) return -1;
  auto status = process_->WaitFor(Deadline::AfterMs(timeout_ms));
  return status.ok() ? ExitCode(*status) : -1;
}

SseStream PostStream(int port, const std::string& path, const nlohmann::json& body,
                     int stop_after_events, const httplib::Headers& headers) {
  SseStream s;
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(60, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = headers;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string pending;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    s.raw.append(data, len);
    pending.append(data, len);
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      std::string event = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        s.done = true;
      } else {
        s.events.push_back(nlohmann::json::parse(payload, nullptr, false));
      }
    }
    return stop_after_events <= 0 || static_cast<int>(s.events.size()) < stop_after_events;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (!client.send(req, res, error)) s.error = httplib::to_string(error);
  s.status = res.status;
  s.content_type = res.get_header_value("Content-Type");
  if (s.status >= 400 && s.events.empty()) s.raw = res.body;
  return s;
}

double MetricValue(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string line = text.substr(pos, eol - pos);
    if (line.rfind(name, 0) == 0 && line.size() > name.size() &&
        (line[name.size()] == ' ' || line[name.size()] == '{')) {
      return std::atof(line.c_str() + line.rfind(' ') + 1);
    }
    pos = eol + 1;
  }
  return -1;
}

}  // namespace pdserve::testing
