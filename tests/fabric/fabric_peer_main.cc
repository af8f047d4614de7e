// fabric_test_peer: the other process of the fabric tests. It runs one TransferEngine and
// obeys line commands on stdin, answering on stdout ("ok ..." / "error ..."), with events
// ("fired", "written", "msg", "sent") printed as they happen. Its memory region is a file
// mapped MAP_SHARED, so the test can fill and check it directly.
//
//   init <provider> <domains> <node|-> <file> <bytes>     -> ok <address hex> <descriptor hex>
//   peer <address hex>                                   -> ok <peer id>
//   expect <imm> <count> <timeout ms>                    -> ok; later: fired <imm> <code> <n>
//   early <imm>                                          -> ok <early arrivals>
//   write <peer> <desc hex> <len> <imm|-> <src off> <src stride> <dst off> <dst stride>
//         <src pages,...> <dst pages,...> <repeat> <deadline ms>
//                                                        -> ok; later: written <ok> <failed>
//   send <peer> <text>                                   -> ok; later: sent <code>
//   quit
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "fabric/transfer_engine.h"

namespace pdserve::fabric {
namespace {

std::mutex g_out_mu;

void Say(const std::string& line) {
  std::lock_guard lock(g_out_mu);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

std::string Code(const Status& s) { return std::string(StatusCodeName(s.code())); }

std::vector<uint32_t> ParseList(const std::string& csv) {
  std::vector<uint32_t> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(static_cast<uint32_t>(std::stoul(item)));
  return out;
}

class Peer {
 public:
  ~Peer() {
    engine_.reset();
    if (memory_ != nullptr) munmap(memory_, bytes_);
  }

  std::string Init(std::istringstream& in) {
    std::string provider, node, file;
    int domains = 1;
    in >> provider >> domains >> node >> file >> bytes_;
    int fd = open(file.c_str(), O_RDWR);
    if (fd < 0) return "error cannot open " + file;
    memory_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (memory_ == MAP_FAILED) {
      memory_ = nullptr;
      return "error mmap failed";
    }
    FabricConfig config;
    auto p = ParseProvider(provider);
    if (!p.ok()) return "error " + p.status().ToString();
    config.provider = *p;
    config.num_domains = domains;
    if (node != "-") config.node = node;
    TransferEngineHandlers handlers;
    handlers.on_message = [](PeerId from, uint64_t, std::span<const std::byte> payload) {
      std::string text(reinterpret_cast<const char*>(payload.data()), payload.size());
      Say("msg " + std::to_string(from) + " " + text);
    };
    auto engine = TransferEngine::Create(config, std::move(handlers));
    if (!engine.ok()) return "error " + engine.status().ToString();
    engine_ = std::move(*engine);
    auto region = engine_->RegisterMemory(memory_, bytes_);
    if (!region.ok()) return "error " + region.status().ToString();
    region_ = *region;
    auto desc = engine_->Describe(region_);
    if (!desc.ok()) return "error " + desc.status().ToString();
    return "ok " + HexEncode(engine_->address().Serialize()) + " " + HexEncode(desc->Serialize());
  }

  std::string AddPeer(std::istringstream& in) {
    std::string hex;
    in >> hex;
    auto bytes = HexDecode(hex);
    if (!bytes.ok()) return "error " + bytes.status().ToString();
    auto address = TransferEngineAddress::Parse(*bytes);
    if (!address.ok()) return "error " + address.status().ToString();
    auto id = engine_->AddPeer(*address);
    if (!id.ok()) return "error " + id.status().ToString();
    return "ok " + std::to_string(*id);
  }

  std::string Expect(std::istringstream& in) {
    uint32_t imm = 0, count = 0;
    int64_t timeout_ms = 0;
    in >> imm >> count >> timeout_ms;
    Status s = engine_->Expect(
        imm, count, Deadline::AfterMs(timeout_ms), [imm](const Status& st, uint32_t arrived) {
          Say("fired " + std::to_string(imm) + " " + Code(st) + " " + std::to_string(arrived));
        });
    return s.ok() ? "ok" : "error " + s.ToString();
  }

  std::string Write(std::istringstream& in) {
    PeerId peer = 0;
    std::string desc_hex, imm, src_csv, dst_csv;
    uint64_t len = 0, src_off = 0, src_stride = 0, dst_off = 0, dst_stride = 0;
    uint64_t repeat = 0;
    int64_t deadline_ms = 0;
    in >> peer >> desc_hex >> len >> imm >> src_off >> src_stride >> dst_off >> dst_stride >>
        src_csv >> dst_csv >> repeat >> deadline_ms;
    auto bytes = HexDecode(desc_hex);
    if (!bytes.ok()) return "error " + bytes.status().ToString();
    auto desc = MemoryDescriptor::Parse(*bytes);
    if (!desc.ok()) return "error " + desc.status().ToString();
    dst_ = *desc;
    src_pages_ = ParseList(src_csv);
    dst_pages_ = ParseList(dst_csv);
    PagedWrite w;
    w.src_region = region_;
    w.src_offset = src_off;
    w.src_stride = src_stride;
    w.src_pages = src_pages_;
    w.peer = peer;
    w.dst = &dst_;
    w.dst_offset = dst_off;
    w.dst_stride = dst_stride;
    w.dst_pages = dst_pages_;
    w.length = len;
    if (imm != "-") w.immediate = static_cast<uint32_t>(std::stoul(imm));
    auto state = std::make_shared<std::atomic<uint64_t>>(repeat);
    auto ok = std::make_shared<std::atomic<uint64_t>>(0);
    Say("ok");
    for (uint64_t i = 0; i < repeat; ++i) {
      w.deadline = Deadline::AfterMs(deadline_ms);
      Status s = engine_->PostPagedWrite(w, Completion{[state, ok, repeat](const Status& st) {
                                           if (st.ok()) ok->fetch_add(1);
                                           if (state->fetch_sub(1) == 1) {
                                             Say("written " + std::to_string(ok->load()) + " " +
                                                 std::to_string(repeat - ok->load()));
                                           }
                                         }});
      if (!s.ok()) return "error " + s.ToString();
    }
    return "";
  }

  std::string Send(std::istringstream& in) {
    PeerId peer = 0;
    std::string text;
    in >> peer >> text;
    Status s = engine_->Send(peer, std::as_bytes(std::span(text.data(), text.size())),
                             Completion{[](const Status& st) { Say("sent " + Code(st)); }});
    return s.ok() ? "ok" : "error " + s.ToString();
  }

  std::string Early(std::istringstream& in) {
    uint32_t imm = 0;
    in >> imm;
    return "ok " + std::to_string(engine_->EarlyArrivals(imm));
  }

  bool ready() const { return engine_ != nullptr; }

 private:
  void* memory_ = nullptr;
  size_t bytes_ = 0;
  std::unique_ptr<TransferEngine> engine_;
  RegionId region_ = 0;
  MemoryDescriptor dst_;
  std::vector<uint32_t> src_pages_, dst_pages_;
};

int Main() {
  Peer peer;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    std::string reply;
    if (command == "quit") break;
    if (command == "init") {
      reply = peer.Init(in);
    } else if (!peer.ready()) {
      reply = "error init first";
    } else if (command == "peer") {
      reply = peer.AddPeer(in);
    } else if (command == "expect") {
      reply = peer.Expect(in);
    } else if (command == "early") {
      reply = peer.Early(in);
    } else if (command == "write") {
      reply = peer.Write(in);
    } else if (command == "send") {
      reply = peer.Send(in);
    } else {
      reply = "error unknown command " + command;
    }
    if (!reply.empty()) Say(reply);
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::fabric

int main() {
  pdserve::InitLogging();
  return pdserve::fabric::Main();
}
