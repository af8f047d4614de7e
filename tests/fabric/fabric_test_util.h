// Shared setup of the fabric engine tests: configs per provider and a started peer process.
// Single-threaded use from test bodies.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fabric/transfer_engine.h"
#include "peer_process.h"

namespace pdserve::fabric::testing {

inline FabricConfig TestConfig(Provider provider, int domains) {
  FabricConfig c;
  c.provider = provider;
  c.num_domains = domains;
  if (provider == Provider::kTcp) c.node = "127.0.0.1";
  return c;
}

inline std::string ProviderParamName(const ::testing::TestParamInfo<Provider>& info) {
  return std::string(ProviderName(info.param));
}

struct StartedPeer {
  TransferEngineAddress address;
  MemoryDescriptor descriptor;
};

// Sends `init` to a started peer process and parses its address and descriptor.
inline Result<StartedPeer> InitPeer(PeerProcess& peer, Provider provider, int domains,
                                    const std::string& node, const SharedFile& file) {
  PD_ASSIGN_OR_RETURN(std::string reply,
                      peer.Command("init " + std::string(ProviderName(provider)) + " " +
                                       std::to_string(domains) + " " + (node.empty() ? "-" : node) +
                                       " " + file.path() + " " + std::to_string(file.size()),
                                   Deadline::AfterMs(20000)));
  std::istringstream in(reply);
  std::string address_hex, desc_hex;
  in >> address_hex >> desc_hex;
  PD_ASSIGN_OR_RETURN(std::string address_bytes, HexDecode(address_hex));
  PD_ASSIGN_OR_RETURN(std::string desc_bytes, HexDecode(desc_hex));
  StartedPeer started;
  PD_ASSIGN_OR_RETURN(started.address, TransferEngineAddress::Parse(address_bytes));
  PD_ASSIGN_OR_RETURN(started.descriptor, MemoryDescriptor::Parse(desc_bytes));
  return started;
}

inline std::string Csv(const std::vector<uint32_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

}  // namespace pdserve::fabric::testing
