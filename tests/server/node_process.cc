#include "node_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "testing/test_paths.h"

extern char** environ;

namespace pdserve::testing {
namespace {

using Clock = std::chrono::steady_clock;

// posix_spawn of the pdserve binary with stdout on a pipe; returns the child's pid.
pid_t Spawn(const std::vector<std::string>& args, int* stdout_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  const std::string binary = BinaryPath("src/cli/pdserve");
  std::vector<std::string> argv_s = {binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return -1;
  }
  *stdout_fd = fds[0];
  return pid;
}

// Reads what is available within the deadline; false on EOF or timeout.
bool ReadSome(int fd, std::string* out, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
  char buf[4096];
  const ssize_t n = read(fd, buf, sizeof(buf));
  if (n <= 0) return false;
  out->append(buf, static_cast<size_t>(n));
  return true;
}

// Waits for pid up to the deadline; the exit status (or 128 + signal), -1 on timeout.
int WaitExit(pid_t pid, Clock::time_point deadline) {
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0 || Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::string RunPdserve(const std::vector<std::string>& args, int* exit_code) {
  int fd = -1;
  const pid_t pid = Spawn(args, &fd);
  *exit_code = -1;
  if (pid < 0) return "";
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  std::string out;
  while (ReadSome(fd, &out, deadline)) {
  }
  close(fd);
  if (Clock::now() >= deadline) kill(pid, SIGKILL);
  *exit_code = WaitExit(pid, Clock::now() + std::chrono::seconds(10));
  return out;
}

NodeProcess::NodeProcess(const std::string& model_dir, const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {"serve", "--listen", "127.0.0.1:0", "--model", model_dir};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  pid_ = Spawn(args, &stdout_fd_);
  if (pid_ < 0) {
    error_ = "cannot spawn pdserve";
    return;
  }
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  std::string out;
  const std::string marker = "ready on http://127.0.0.1:";
  while (ReadSome(stdout_fd_, &out, deadline)) {
    const size_t at = out.find(marker);
    if (at != std::string::npos && out.find(' ', at + marker.size()) != std::string::npos) {
      port_ = std::atoi(out.c_str() + at + marker.size());
      return;
    }
  }
  error_ = "pdserve serve did not get ready; stdout: " + out;
}

NodeProcess::~NodeProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    WaitExit(pid_, Clock::now() + std::chrono::seconds(10));
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

httplib::Client NodeProcess::Client() const {
  httplib::Client c("127.0.0.1", port_);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(60, 0);
  c.set_write_timeout(10, 0);
  return c;
}

int NodeProcess::Terminate(int timeout_ms) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const int status = WaitExit(pid_, Clock::now() + std::chrono::milliseconds(timeout_ms));
  if (status >= 0) pid_ = -1;
  return status;
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
