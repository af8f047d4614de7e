#include "fabric/topology.h"

#include <algorithm>

#include <fmt/format.h>
#include <hwloc.h>

namespace pdserve::fabric {

struct Topology::HwlocHolder {
  hwloc_topology_t topology = nullptr;
  HwlocHolder() = default;
  HwlocHolder(const HwlocHolder&) = delete;
  HwlocHolder& operator=(const HwlocHolder&) = delete;
  ~HwlocHolder() {
    if (topology != nullptr) hwloc_topology_destroy(topology);
  }
};

namespace {

std::vector<int> CpuList(hwloc_const_bitmap_t set) {
  std::vector<int> cpus;
  if (set == nullptr) return cpus;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, set) { cpus.push_back(static_cast<int>(i)); }
  hwloc_bitmap_foreach_end();
  return cpus;
}

std::string PciBusId(hwloc_obj_t osdev) {
  for (hwloc_obj_t p = osdev->parent; p != nullptr; p = p->parent) {
    if (p->type == HWLOC_OBJ_PCI_DEVICE) {
      const auto& pci = p->attr->pcidev;
      return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", pci.domain, pci.bus, pci.dev, pci.func);
    }
  }
  return "";
}

Nic DescribeNic(hwloc_topology_t topo, hwloc_obj_t osdev) {
  Nic nic;
  nic.name = osdev->name != nullptr ? osdev->name : "";
  nic.pci_bus_id = PciBusId(osdev);
  hwloc_obj_t ancestor = hwloc_get_non_io_ancestor_obj(topo, osdev);
  if (ancestor != nullptr) {
    nic.cpus = CpuList(ancestor->cpuset);
    // Exactly one NUMA node under the ancestor means the NIC is local to it.
    if (ancestor->nodeset != nullptr && hwloc_bitmap_weight(ancestor->nodeset) == 1) {
      nic.numa_node = hwloc_bitmap_first(ancestor->nodeset);
    }
  }
  return nic;
}

bool IsNic(hwloc_obj_t osdev) {
  auto t = osdev->attr->osdev.type;
  return t == HWLOC_OBJ_OSDEV_NETWORK || t == HWLOC_OBJ_OSDEV_OPENFABRICS;
}

}  // namespace

Result<Topology> Topology::LoadSystem() { return Load("", false); }

Result<Topology> Topology::LoadXml(std::string_view xml) { return Load(xml, true); }

Result<Topology> Topology::Load(std::string_view xml, bool from_xml) {
  auto holder = std::make_shared<HwlocHolder>();
  if (hwloc_topology_init(&holder->topology) != 0) {
    return Status::Internal("hwloc_topology_init failed");
  }
  hwloc_topology_t topo = holder->topology;
  // NICs are I/O objects, which hwloc drops by default.
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (from_xml) {
    std::string buffer(xml);  // hwloc wants the size including the terminating NUL
    if (hwloc_topology_set_xmlbuffer(topo, buffer.c_str(), static_cast<int>(buffer.size() + 1)) !=
        0) {
      return Status::InvalidArgument("hwloc rejected the topology XML");
    }
    if (hwloc_topology_load(topo) != 0) {
      return Status::InvalidArgument("hwloc could not load the topology XML");
    }
  } else if (hwloc_topology_load(topo) != 0) {
    return Status::Internal("hwloc could not discover this machine's topology");
  }

  Topology t;
  t.hwloc_ = holder;
  t.is_this_system_ = hwloc_topology_is_thissystem(topo) != 0 && !from_xml;
  t.all_cpus_ = CpuList(hwloc_topology_get_topology_cpuset(topo));
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) {
    t.numa_nodes_.push_back(NumaNode{static_cast<int>(n->os_index), CpuList(n->cpuset)});
  }
  for (hwloc_obj_t d = hwloc_get_next_osdev(topo, nullptr); d != nullptr;
       d = hwloc_get_next_osdev(topo, d)) {
    if (IsNic(d)) t.nics_.push_back(DescribeNic(topo, d));
  }
  std::sort(t.nics_.begin(), t.nics_.end(),
            [](const Nic& a, const Nic& b) { return a.name < b.name; });
  return t;
}

const Nic* Topology::FindNic(std::string_view name) const {
  for (const Nic& n : nics_) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

const NumaNode* Topology::FindNumaNode(int os_index) const {
  for (const NumaNode& n : numa_nodes_) {
    if (n.os_index == os_index) return &n;
  }
  return nullptr;
}

Result<std::vector<DomainPlacement>> Topology::PlaceDomains(
    const std::vector<std::string>& available, int count, int numa_node,
    const std::vector<std::string>& override_nics) const {
  if (available.empty()) return Status::NotFound("the fabric provider offers no domains");
  if (count < 1) return Status::InvalidArgument("domain count must be positive");
  std::vector<std::string> order;
  if (!override_nics.empty()) {
    for (const std::string& name : override_nics) {
      if (std::find(available.begin(), available.end(), name) == available.end()) {
        return Status::InvalidArgument(
            fmt::format("configured NIC '{}' is not offered by the fabric provider", name));
      }
      order.push_back(name);
    }
  } else {
    // Local NICs first (in name order), then remote ones, then those hwloc does not know,
    // each group keeping the provider's order.
    auto rank = [&](const std::string& name) {
      const Nic* nic = FindNic(name);
      if (nic == nullptr) return 2;
      return (numa_node < 0 || nic->numa_node == numa_node) ? 0 : 1;
    };
    order = available;
    std::stable_sort(order.begin(), order.end(),
                     [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  }
  const NumaNode* memory_node = FindNumaNode(numa_node);
  std::vector<DomainPlacement> placements;
  for (int i = 0; i < count; ++i) {
    DomainPlacement p;
    p.nic = order[static_cast<size_t>(i) % order.size()];
    if (const Nic* nic = FindNic(p.nic); nic != nullptr && !nic->cpus.empty()) {
      p.cpus = nic->cpus;
    } else if (memory_node != nullptr) {
      p.cpus = memory_node->cpus;
    }
    placements.push_back(std::move(p));
  }
  return placements;
}

Status Topology::BindCurrentThread(const std::vector<int>& cpus) const {
  if (cpus.empty()) return Status::Ok();
  if (!is_this_system_) {
    return Status::FailedPrecondition("cannot bind threads with a topology of another machine");
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (set == nullptr) return Status::ResourceExhausted("hwloc_bitmap_alloc failed");
  for (int cpu : cpus) hwloc_bitmap_set(set, static_cast<unsigned>(cpu));
  int rc = hwloc_set_cpubind(hwloc_->topology, set, HWLOC_CPUBIND_THREAD);
  hwloc_bitmap_free(set);
  if (rc != 0) return Status::FromErrno("hwloc_set_cpubind", errno);
  return Status::Ok();
}

}  // namespace pdserve::fabric
