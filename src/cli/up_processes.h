// Child processes of `pdserve up`: the plan of which process gets which cores, and a group of
// children that die with their parent and are always reaped. Used from main()'s thread only
// (PR_SET_PDEATHSIG is tied to the thread that forks, which must outlive the children).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "common/subprocess.h"

namespace pdserve::cli {

// One node `up` starts: a `pdserve serve --role ROLE` child process.
struct NodeSpec {
  std::string role = "colocated";  // colocated | prefill | decode
  std::vector<int> cpus;           // pinned set; empty: not pinned
  int threads = 1;
  int port = 0;
  std::vector<std::string> prefill_peers;  // decode: every prefill node's HOST:PORT
};

struct CorePlan {
  std::vector<int> router_cpus;
  std::vector<std::vector<int>> node_cpus;  // one set per node
};
// Splits `cpus` (the cores this process may use) among the router and `nodes` nodes: the router
// gets a core of its own when there are more cores than nodes (it needs little), the nodes
// split the rest evenly; with fewer cores than nodes, nodes share cores round robin.
CorePlan PlanCores(const std::vector<int>& cpus, int nodes);
// The cores this process may run on (sched_getaffinity).
std::vector<int> AllowedCpus();
// Pins the calling thread (and the threads it starts later) to `cpus`.
Status PinCurrentThread(const std::vector<int>& cpus);
// A TCP port on 127.0.0.1 free right now (bound to port 0 and released).
Result<int> FindFreePort();

class ChildProcesses {
 public:
  ChildProcesses() = default;
  ~ChildProcesses();  // StopAll with a short deadline: no child outlives this object
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;

  // Starts `argv` (argv[0] is the executable path) in its own process group, pinned to `cpus`,
  // with SIGKILL as its parent-death signal, every signal unblocked and `env` added to this
  // process's environment (secrets go there, not in argv, which every local user can read).
  // Returns its pid.
  Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<int>& cpus,
                      const std::vector<std::pair<std::string, std::string>>& env = {});
  // Reaps children that exited; returns a description of each ("pid 12 exited with 1").
  std::vector<std::string> ReapExited();
  // SIGTERM to each child's group, wait until `deadline`, then SIGKILL; reaps every child.
  void StopAll(Deadline deadline);
  std::vector<pid_t> pids() const;

 private:
  std::vector<Subprocess> children_;  // not yet reaped
};

}  // namespace pdserve::cli
