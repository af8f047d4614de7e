#include "cli/up_processes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

namespace pdserve::cli {

CorePlan PlanCores(const std::vector<int>& cpus, int nodes) {
  CorePlan plan;
  plan.node_cpus.resize(static_cast<size_t>(std::max(nodes, 0)));
  if (cpus.empty() || nodes <= 0) return plan;
  std::vector<int> for_nodes = cpus;
  if (static_cast<int>(cpus.size()) > nodes) {
    plan.router_cpus = {cpus.front()};
    for_nodes.erase(for_nodes.begin());
  } else {
    plan.router_cpus = cpus;  // shares; it mostly waits on sockets
  }
  const size_t n = static_cast<size_t>(nodes);
  if (for_nodes.size() >= n) {
    const size_t per = for_nodes.size() / n;
    for (size_t i = 0; i < n; ++i) {
      plan.node_cpus[i].assign(for_nodes.begin() + i * per, for_nodes.begin() + (i + 1) * per);
    }
  } else {
    for (size_t i = 0; i < n; ++i) plan.node_cpus[i] = {for_nodes[i % for_nodes.size()]};
  }
  return plan;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

namespace {

cpu_set_t ToCpuSet(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  return set;
}

}  // namespace

Status PinCurrentThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return Status::Ok();
  cpu_set_t set = ToCpuSet(cpus);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return Status::FromErrno("sched_setaffinity", errno);
  }
  return Status::Ok();
}

Result<int> FindFreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  Status status;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    status = Status::FromErrno("bind 127.0.0.1:0", errno);
  }
  close(fd);
  if (!status.ok()) return status;
  return static_cast<int>(ntohs(addr.sin_port));
}

ChildProcesses::~ChildProcesses() { StopAll(Deadline::AfterMs(5000)); }

Result<pid_t> ChildProcesses::Spawn(const std::vector<std::string>& argv,
                                    const std::vector<int>& cpus) {
  if (argv.empty()) return Status::InvalidArgument("Spawn: empty argv");
  // Everything the child touches is prepared here: between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const cpu_set_t set = ToCpuSet(cpus);
  const bool pin = !cpus.empty();
  const pid_t parent = getpid();
  sigset_t none;
  sigemptyset(&none);

  const pid_t pid = fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid == 0) {
    setpgid(0, 0);  // own group: a terminal's Ctrl-C reaches `up`, which stops children in order
    prctl(PR_SET_PDEATHSIG, SIGKILL);     // `up` killed with -9 takes its children along
    if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
    if (pin) sched_setaffinity(0, sizeof(set), &set);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // `up` blocks SIGTERM; the node must not
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so the group exists before any kill(-pid)
  pids_.push_back(pid);
  return pid;
}

std::vector<std::string> ChildProcesses::ReapExited() {
  std::vector<std::string> exited;
  std::erase_if(pids_, [&](pid_t pid) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == 0) return false;
    if (r < 0) return errno == ECHILD;
    if (WIFEXITED(status)) {
      exited.push_back("pid " + std::to_string(pid) + " exited with " +
                       std::to_string(WEXITSTATUS(status)));
    } else {
      exited.push_back("pid " + std::to_string(pid) + " killed by signal " +
                       std::to_string(WTERMSIG(status)));
    }
    return true;
  });
  return exited;
}

void ChildProcesses::StopAll(Deadline deadline) {
  for (pid_t pid : pids_) kill(-pid, SIGTERM);
  while (!pids_.empty() && !deadline.Passed()) {
    ReapExited();
    if (!pids_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t pid : pids_) {
    kill(-pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pids_.clear();
}

}  // namespace pdserve::cli
