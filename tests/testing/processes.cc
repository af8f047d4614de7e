#include "testing/processes.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include "testing/test_paths.h"

namespace pdserve::testing {

bool ProcessAlive(pid_t pid) {
  // The state follows the command name in parentheses, which may itself hold ") ".
  const std::string stat = ProcFile(pid, "stat");
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

int RemoveShmRegionsOf(pid_t pid) {
  const std::string prefix = std::to_string(pid) + ":";
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) != 0) continue;
    if (std::filesystem::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  const std::filesystem::path tasks = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream children(task.path() / "children");
    pid_t child;
    while (children >> child) out.push_back(child);
  }
  return out;
}

std::string ProcFile(pid_t pid, const std::string& name) {
  // read(2), not a stream: a process reaped between the open and the read fails the read with
  // ESRCH, which std::filebuf turns into an exception; here it reads as what was read so far.
  const std::string path = "/proc/" + std::to_string(pid) + "/" + name;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

long ProcStatusKib(pid_t pid, const std::string& field) {
  std::istringstream status(ProcFile(pid, "status"));
  std::string key;
  while (status >> key) {
    if (key == field) {
      long kib = -1;
      status >> kib;
      return kib;
    }
    status.ignore(1 << 16, '\n');
  }
  return -1;
}

long SettledStatusKib(pid_t pid, const std::string& field) {
  long last = ProcStatusKib(pid, field);
  int same = 0;
  const Deadline deadline = Deadline::AfterMs(10000);
  while (same < 3 && !deadline.Passed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const long now = ProcStatusKib(pid, field);
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

bool WaitAllGone(const std::vector<pid_t>& pids, Deadline deadline) {
  for (;;) {
    bool any = false;
    for (pid_t pid : pids) any = any || ProcessAlive(pid);
    if (!any) return true;
    if (deadline.Passed()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

CommandRun RunToCompletion(const std::vector<std::string>& argv, Deadline deadline,
                           const CommandOptions& command) {
  CommandRun run;
  SubprocessOptions options;
  options.argv = argv;
  options.env = command.env;
  options.stdin_mode = StdStream::kNull;
  options.stdout_mode = StdStream::kPipe;
  options.stderr_mode = StdStream::kPipe;
  std::string errors_dir;
  if (command.separate_stderr) {
    errors_dir = MakeTempDir("command_stderr");
    options.stderr_mode = StdStream::kFile;
    options.stderr_path = errors_dir + "/stderr";
  }
  auto process = Subprocess::Spawn(options);
  if (!process.ok()) {
    run.output = process.status().ToString();
  } else {
    // Reading to EOF first: a child blocked on a full pipe would never exit.
    auto output = process->ReadAll(deadline);
    if (output.ok()) run.output = *output;
    auto exit = process->WaitFor(deadline);
    if (exit.ok()) {
      run.finished = true;
      run.exit = *exit;
    }
    // Otherwise the destructor kills it.
  }
  if (!errors_dir.empty()) {
    std::ifstream in(options.stderr_path);
    run.errors.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::filesystem::remove_all(errors_dir);
  }
  return run;
}

CommandRun RunPdserve(const std::vector<std::string>& args, Deadline deadline,
                      const CommandOptions& options) {
  std::vector<std::string> argv{BinaryPath("src/cli/pdserve")};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunToCompletion(argv, deadline, options);
}

}  // namespace pdserve::testing
