// Secret-grade random bytes from the kernel (getrandom(2)): handshake nonces, cluster secrets.
// Not for sampling or ids (those use seeded generators). Safe from any thread.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"

namespace pdserve {

// Fills `out`; IoError (naming `what`) if the kernel's generator cannot be read.
Status FillRandomBytes(std::span<uint8_t> out, const char* what);

}  // namespace pdserve
