#include "cli/up_processes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
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
                                    const std::vector<int>& cpus,
                                    const std::vector<std::pair<std::string, std::string>>& env) {
  SubprocessOptions options;
  options.argv = argv;
  options.env = env;
  options.cpus = cpus;
  // Own group: a terminal's Ctrl-C reaches `up`, which stops children in order.
  options.new_process_group = true;
  options.kill_with_parent = true;  // `up` killed with -9 takes its children along
  options.unblock_signals = true;   // `up` blocks SIGTERM; the node must not
  PD_ASSIGN_OR_RETURN(Subprocess child, Subprocess::Spawn(options));
  const pid_t pid = child.pid();
  children_.push_back(std::move(child));
  return pid;
}

std::vector<std::string> ChildProcesses::ReapExited() {
  std::vector<std::string> exited;
  std::erase_if(children_, [&](Subprocess& child) {
    const std::optional<ExitStatus> status = child.TryWait();
    if (!status) return false;
    exited.push_back("pid " + std::to_string(child.pid()) + " " + status->ToString());
    return true;
  });
  return exited;
}

void ChildProcesses::StopAll(Deadline deadline) {
  for (Subprocess& child : children_) (void)child.Signal(SIGTERM, /*group=*/true);
  while (!children_.empty() && !deadline.Passed()) {
    ReapExited();
    if (!children_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  children_.clear();  // each remaining child's group is killed with SIGKILL and reaped
}

std::vector<pid_t> ChildProcesses::pids() const {
  std::vector<pid_t> pids;
  for (const Subprocess& child : children_) pids.push_back(child.pid());
  return pids;
}

}  // namespace pdserve::cli
