#include "messenger/send_control.h"

#include <span>
#include <string>

#include "common/logging.h"

namespace pdserve::messenger {

void SendControlMessage(fabric::TransferEngine& fabric, fabric::PeerId peer, const Message& message,
                        Duration timeout) {
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
  Status s = fabric.Send(peer, std::as_bytes(std::span(bytes->data(), bytes->size())),
                         fabric::Completion{.callback = on_done, .counter = nullptr},
                         Deadline::After(timeout));
  if (!s.ok()) PD_LOG_DEBUG("cannot send {}: {}", MessageTypeName(TypeOf(message)), s.ToString());
}

}  // namespace pdserve::messenger
