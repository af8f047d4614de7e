// SendControlMessage: encodes one control message and sends it to a peer over the transfer
// engine, best effort. Control messages are fire-and-forget by design (DESIGN.md §3): every
// wait they could answer has its own deadline, so a lost one is logged (debug) and otherwise
// ignored. Safe from any thread the engine allows posting from.
#pragma once

#include "common/clock.h"
#include "fabric/transfer_engine.h"
#include "messenger/protocol.h"

namespace pdserve::messenger {

void SendControlMessage(fabric::TransferEngine& fabric, fabric::PeerId peer, const Message& message,
                        Duration timeout);

}  // namespace pdserve::messenger
