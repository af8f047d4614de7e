#include "messenger/messenger_core.h"

#include <span>
#include <string>

#include "common/logging.h"

namespace pdserve::messenger {

MessengerCore::MessengerCore(MessengerOptions options, MessengerHandlers handlers)
    : options_(std::move(options)),
      incarnation_(NewIncarnation()),
      handlers_(std::move(handlers)) {}

Result<std::unique_ptr<MessengerCore>> MessengerCore::Create(Engine* engine,
                                                             MessengerOptions options,
                                                             MessengerHandlers handlers) {
  if (engine == nullptr) return Status::InvalidArgument("the messenger needs an engine");
  if (options.cluster_key.empty()) {
    return Status::InvalidArgument("the messenger needs a cluster key");
  }
  std::unique_ptr<MessengerCore> core(new MessengerCore(std::move(options), std::move(handlers)));
  MessengerCore* c = core.get();
  c->loop_ = std::make_shared<ControlLoop>(c->options_.heartbeat_interval, [c] {
    if (c->handlers_.on_tick) c->handlers_.on_tick();
  });
  fabric::TransferEngineHandlers fabric_handlers;
  fabric_handlers.on_message = [c](fabric::PeerId from, uint64_t instance,
                                   std::span<const std::byte> payload) {
    Result<Message> message = DecodeMessage(
        std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
    if (!message.ok()) {
      PD_LOG_WARN("dropped a malformed message from peer {}: {}", from,
                  message.status().ToString());
      return;
    }
    c->loop_->Post([c, from, instance, m = std::move(message).value()]() mutable {
      if (c->handlers_.on_message) c->handlers_.on_message(from, instance, std::move(m));
    });
  };
  // D registers every expectation before its PrefillRequest leaves, so an immediate nobody
  // expects belongs to an abandoned transfer; P is no write target. Either way: drop it.
  fabric_handlers.on_unmatched_immediate = [](fabric::PeerId, uint32_t) { return true; };
  fabric_handlers.on_peer_error = [c](fabric::PeerId peer, const Status& error) {
    c->loop_->Post([c, peer, error] {
      if (c->handlers_.on_peer_error) c->handlers_.on_peer_error(peer, error);
    });
  };
  PD_ASSIGN_OR_RETURN(
      c->fabric_, fabric::TransferEngine::Create(c->options_.fabric, std::move(fabric_handlers)));
  std::vector<KvLayout> layouts;
  for (int r = 0; r < engine->tp_size(); ++r) layouts.push_back(engine->kv_cache(r).layout());
  PD_ASSIGN_OR_RETURN(c->local_,
                      MakeLocalNodeInfo(engine->model().config().num_kv_heads, layouts,
                                        std::vector<std::string>(layouts.size()),
                                        c->options_.model_fingerprint, c->options_.kernel_path));
  return core;
}

MessengerCore::~MessengerCore() { Shutdown(); }

void MessengerCore::Shutdown() {
  if (loop_) loop_->Stop();
  fabric_.reset();
}

void MessengerCore::Send(fabric::PeerId peer, const Message& message) {
  Result<std::string> bytes = EncodeMessage(message);
  if (!bytes.ok()) {
    // Only a message this process built wrongly fails to encode.
    PD_LOG_ERROR("cannot encode {}: {}", MessageTypeName(TypeOf(message)),
                 bytes.status().ToString());
    return;
  }
  auto on_done = [](const Status& st) {
    if (!st.ok()) PD_LOG_DEBUG("control message lost: {}", st.ToString());
  };
  Status s = fabric_->Send(peer, std::as_bytes(std::span(bytes->data(), bytes->size())),
                           fabric::Completion{.callback = on_done, .counter = nullptr},
                           Deadline::After(options_.peer_timeout));
  if (!s.ok()) PD_LOG_DEBUG("cannot send {}: {}", MessageTypeName(TypeOf(message)), s.ToString());
}

void MessengerCore::RetireViews(PeerViews& views, bool revoke, std::string_view peer_name) {
  views.Retire(*fabric_, revoke, &retired_views_, peer_name);
}

}  // namespace pdserve::messenger
