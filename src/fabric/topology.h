// Machine topology for placing transfer domains: NUMA nodes, their CPUs, and NICs with the
// CPUs and NUMA node they hang off, discovered with hwloc (from this machine or from an hwloc
// XML document, which is how tests describe machines they do not run on).
// A Topology is an immutable value after Load*; safe to share between threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pdserve::fabric {

struct NumaNode {
  int os_index = -1;
  std::vector<int> cpus;  // OS indexes of the PUs local to this node
};

struct Nic {
  std::string name;        // OS device name: "mlx5_0", "eth0", "efa_0", ...
  std::string pci_bus_id;  // "0000:17:00.0", empty when not on PCI
  int numa_node = -1;      // OS index of the nearest NUMA node, -1 when unknown
  std::vector<int> cpus;   // PUs local to the NIC (its non-I/O ancestor's cpuset)
};

// Where one domain goes: the NIC (libfabric domain name) and the CPUs of its progress thread
// (empty: leave unpinned).
struct DomainPlacement {
  std::string nic;
  std::vector<int> cpus;
};

class Topology {
 public:
  static Result<Topology> LoadSystem();
  static Result<Topology> LoadXml(std::string_view xml);

  const std::vector<NumaNode>& numa_nodes() const { return numa_nodes_; }
  const std::vector<Nic>& nics() const { return nics_; }
  const std::vector<int>& all_cpus() const { return all_cpus_; }
  const Nic* FindNic(std::string_view name) const;
  const NumaNode* FindNumaNode(int os_index) const;

  // Places `count` domains on `available` NICs (the libfabric domain names the provider
  // offers). With `override_nics` non-empty those names are used in order (InvalidArgument if
  // one is not available). Otherwise NICs local to `numa_node` come first, then the others by
  // name; NICs are reused round-robin when count exceeds them. CPUs: the NIC's local CPUs;
  // for a NIC hwloc does not know (loopback, shm), the CPUs of `numa_node`, else none.
  Result<std::vector<DomainPlacement>> PlaceDomains(
      const std::vector<std::string>& available, int count, int numa_node,
      const std::vector<std::string>& override_nics) const;

  // Binds the calling thread to `cpus` through hwloc. Ok and no-op for an empty list.
  // Only meaningful on a topology from LoadSystem (an XML machine is not this one).
  Status BindCurrentThread(const std::vector<int>& cpus) const;

 private:
  struct HwlocHolder;
  std::shared_ptr<HwlocHolder> hwloc_;  // kept for binding; shared so copies stay cheap
  bool is_this_system_ = false;
  std::vector<NumaNode> numa_nodes_;
  std::vector<Nic> nics_;
  std::vector<int> all_cpus_;

  static Result<Topology> Load(std::string_view xml, bool from_xml);
};

}  // namespace pdserve::fabric
