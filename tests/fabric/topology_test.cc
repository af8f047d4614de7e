#include "fabric/topology.h"

#include <gtest/gtest.h>

#include <string>

namespace pdserve::fabric {
namespace {

// A made-up two-socket machine: NUMA node 0 has PUs 0-3 and NICs mlx5_0/mlx5_1, NUMA node 1
// has PUs 4-7 and NICs mlx5_2/mlx5_3 (each NIC behind its own PCI host bridge).
std::string Package(int index, const std::string& cpuset, int first_pu, int first_bus) {
  const std::string nodeset = index == 0 ? "0x00000001" : "0x00000002";
  std::string xml = "<object type=\"Package\" os_index=\"" + std::to_string(index) +
                    "\" cpuset=\"" + cpuset + "\" complete_cpuset=\"" + cpuset + "\" nodeset=\"" +
                    nodeset + "\" complete_nodeset=\"" + nodeset + "\">\n";
  xml += "<object type=\"NUMANode\" os_index=\"" + std::to_string(index) + "\" cpuset=\"" + cpuset +
         "\" complete_cpuset=\"" + cpuset + "\" nodeset=\"" + nodeset + "\" complete_nodeset=\"" +
         nodeset + "\" local_memory=\"1073741824\"/>\n";
  for (int pu = first_pu; pu < first_pu + 4; ++pu) {
    char mask[16];
    std::snprintf(mask, sizeof mask, "0x%08x", 1u << pu);
    xml += std::string("<object type=\"Core\" os_index=\"") + std::to_string(pu) + "\" cpuset=\"" +
           mask + "\" complete_cpuset=\"" + mask + "\" nodeset=\"" + nodeset +
           "\" complete_nodeset=\"" + nodeset + "\">" + "<object type=\"PU\" os_index=\"" +
           std::to_string(pu) + "\" cpuset=\"" + mask + "\" complete_cpuset=\"" + mask +
           "\" nodeset=\"" + nodeset + "\" complete_nodeset=\"" + nodeset + "\"/></object>\n";
  }
  for (int nic = 0; nic < 2; ++nic) {
    const int bus = first_bus + nic;
    char bus_hex[8];
    std::snprintf(bus_hex, sizeof bus_hex, "%02x", bus);
    xml +=
        std::string("<object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[") +
        bus_hex + "-" + bus_hex + "]\">\n";
    xml += std::string("<object type=\"PCIDev\" pci_busid=\"0000:") + bus_hex +
           ":00.0\" pci_type=\"0207 [15b3:1017] [15b3:0007] 00\" pci_link_speed=\"0.0\">\n";
    xml += "<object type=\"OSDev\" name=\"mlx5_" + std::to_string(index * 2 + nic) +
           "\" osdev_type=\"3\"/>\n</object>\n</object>\n";
  }
  return xml + "</object>\n";
}

std::string TwoSocketXml() {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n<topology version=\"2.0\">\n"
         "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x000000ff\" "
         "complete_cpuset=\"0x000000ff\" allowed_cpuset=\"0x000000ff\" nodeset=\"0x00000003\" "
         "complete_nodeset=\"0x00000003\" allowed_nodeset=\"0x00000003\">\n" +
         Package(0, "0x0000000f", 0, 0x17) + Package(1, "0x000000f0", 4, 0x81) +
         "</object>\n</topology>\n";
}

const std::vector<std::string> kAvailable = {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"};

TEST(TopologyTest, FindsNumaNodesCpusAndNics) {
  auto t = Topology::LoadXml(TwoSocketXml());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->numa_nodes().size(), 2u);
  EXPECT_EQ(t->numa_nodes()[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  ASSERT_EQ(t->nics().size(), 4u);
  const Nic* nic = t->FindNic("mlx5_2");
  ASSERT_NE(nic, nullptr);
  EXPECT_EQ(nic->numa_node, 1);
  EXPECT_EQ(nic->cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(nic->pci_bus_id, "0000:81:00.0");
  EXPECT_EQ(t->FindNic("mlx5_1")->numa_node, 0);
}

TEST(TopologyTest, PrefersNicsLocalToTheMemory) {
  auto t = Topology::LoadXml(TwoSocketXml());
  ASSERT_TRUE(t.ok());
  auto p = t->PlaceDomains(kAvailable, 2, /*numa_node=*/1, {});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ((*p)[0].nic, "mlx5_2");
  EXPECT_EQ((*p)[1].nic, "mlx5_3");
  EXPECT_EQ((*p)[0].cpus, (std::vector<int>{4, 5, 6, 7}));
  // More domains than local NICs: the remote ones follow, then they are reused.
  p = t->PlaceDomains(kAvailable, 5, 0, {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0].nic, "mlx5_0");
  EXPECT_EQ((*p)[2].nic, "mlx5_2");
  EXPECT_EQ((*p)[2].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ((*p)[4].nic, "mlx5_0");
}

TEST(TopologyTest, ConfigOverrideWins) {
  auto t = Topology::LoadXml(TwoSocketXml());
  ASSERT_TRUE(t.ok());
  auto p = t->PlaceDomains(kAvailable, 2, 0, {"mlx5_3", "mlx5_1"});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0].nic, "mlx5_3");
  EXPECT_EQ((*p)[0].cpus, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ((*p)[1].nic, "mlx5_1");
  EXPECT_EQ((*p)[1].cpus, (std::vector<int>{0, 1, 2, 3}));
  auto bad = t->PlaceDomains(kAvailable, 1, 0, {"mlx5_9"});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(TopologyTest, UnknownNicFallsBackToMemoryNodeCpus) {
  auto t = Topology::LoadXml(TwoSocketXml());
  ASSERT_TRUE(t.ok());
  auto p = t->PlaceDomains({"shm"}, 2, 1, {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[1].nic, "shm");
  EXPECT_EQ((*p)[1].cpus, (std::vector<int>{4, 5, 6, 7}));
  p = t->PlaceDomains({"lo"}, 1, -1, {});
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE((*p)[0].cpus.empty());
}

TEST(TopologyTest, RejectsBadXmlAndForeignBinding) {
  EXPECT_FALSE(Topology::LoadXml("<topology>not really").ok());
  auto t = Topology::LoadXml(TwoSocketXml());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->BindCurrentThread({1}).code(), StatusCode::kFailedPrecondition);
}

TEST(TopologyTest, LoadsThisMachine) {
  auto t = Topology::LoadSystem();
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_FALSE(t->all_cpus().empty());
  EXPECT_TRUE(t->BindCurrentThread(t->all_cpus()).ok());
}

}  // namespace
}  // namespace pdserve::fabric
