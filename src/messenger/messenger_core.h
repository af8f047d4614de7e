// MessengerCore: what both sides of the KV messenger hold — the options, this process's
// incarnation, its NodeInfo (DESIGN.md §3.1), the event log, the control loop on which all
// messenger state lives, and the transfer engine, whose control messages are decoded and whose
// peer errors are reported on that loop. Removed peers' views are kept here until the transfer
// engine is gone (a provider may touch their addresses until then).
//
// Threads: Create, Start, Shutdown and the destructor from the owner's thread. Send and the
// accessors from any thread until Shutdown. Handlers run on the control loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "common/revocable_mapping.h"
#include "common/status.h"
#include "engine/engine.h"
#include "fabric/transfer_engine.h"
#include "messenger/control_loop.h"
#include "messenger/event_log.h"
#include "messenger/messenger_options.h"
#include "messenger/node_info.h"
#include "messenger/peer_views.h"
#include "messenger/protocol.h"

namespace pdserve::messenger {

struct MessengerHandlers {
  // A decoded control message (malformed ones are logged and dropped). `from` is
  // fabric::kUnknownPeer for a sender not (or no longer) added.
  std::function<void(fabric::PeerId from, uint64_t sender_instance, Message message)> on_message;
  // The first error of an operation to `peer`.
  std::function<void(fabric::PeerId peer, const Status& error)> on_peer_error;
  // Every options.heartbeat_interval.
  std::function<void()> on_tick;
};

class MessengerCore {
 public:
  // Opens the transfer engine and describes this node from `engine`'s caches (every rank's
  // layout; no memory descriptor: each peer gets views of its own). The loop is not started.
  static Result<std::unique_ptr<MessengerCore>> Create(Engine* engine, MessengerOptions options,
                                                       MessengerHandlers handlers);
  ~MessengerCore();
  MessengerCore(const MessengerCore&) = delete;
  MessengerCore& operator=(const MessengerCore&) = delete;

  void Start() { loop_->Start(); }
  // Stops the loop (nothing more runs on it), then closes the transfer engine (every transfer
  // and expectation ends with Cancelled); the retired views go with the core. Idempotent; the
  // destructor calls it. Whatever a peer's live views are, free them only after this.
  void Shutdown();

  const MessengerOptions& options() const { return options_; }
  uint64_t incarnation() const { return incarnation_; }
  const NodeInfo& local() const { return local_; }
  EventLog& events() { return events_; }
  const EventLog& events() const { return events_; }
  fabric::TransferEngine& fabric() { return *fabric_; }
  const fabric::TransferEngine& fabric() const { return *fabric_; }
  // Posts `fn` to the control loop (dropped once stopped).
  bool Post(std::function<void()> fn) { return loop_->Post(std::move(fn)); }
  // For callbacks that may outlive the messenger (engine outputs, fabric completions).
  std::weak_ptr<ControlLoop> weak_loop() const { return loop_; }

  // Sends one control message, best effort: control messages are fire-and-forget by design
  // (DESIGN.md §3): every wait they could answer has its own deadline, so a lost one is logged
  // (debug) and otherwise ignored.
  void Send(fabric::PeerId peer, const Message& message);

  // After fabric().RemovePeer: retires a peer's views (PeerViews::Retire), keeping them until
  // the transfer engine is gone. Loop thread.
  void RetireViews(PeerViews& views, bool revoke, std::string_view peer_name);

 private:
  MessengerCore(MessengerOptions options, MessengerHandlers handlers);

  const MessengerOptions options_;
  const uint64_t incarnation_;
  const MessengerHandlers handlers_;
  NodeInfo local_;
  EventLog events_;
  std::shared_ptr<ControlLoop> loop_;
  // Declared before fabric_, so destroyed after it (the destructor also orders them).
  std::vector<RevocableMapping> retired_views_;
  std::unique_ptr<fabric::TransferEngine> fabric_;
};

}  // namespace pdserve::messenger
