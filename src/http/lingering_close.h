// Lingering close (as nginx does it): after answering a request whose body was not read (413,
// 431), read and discard what the client still sends for a bounded time before the socket
// closes. Closing with unread data makes the kernel reset the connection, and clients still
// writing their body (Node's fetch, Python's http.client) then report the reset instead of
// the answer that was already sent. Call from the thread that serves the connection, after
// the answer was written; the socket stays the server's (only read here, never closed);
// http::CurrentClientSocket() names it.
#pragma once

#include <cstdint>
#include <string>

#include "common/clock.h"

namespace pdserve::http {

struct LingerLimits {
  Duration idle = std::chrono::milliseconds(500);  // the client paused this long: done
  Duration total = std::chrono::seconds(5);        // never longer than this in all
  uint64_t max_bytes = uint64_t{256} << 20;        // never more than this
};

// Reads and discards from `fd` until the client closes, pauses for `limits.idle`, or a limit
// is reached.
void DrainBeforeClose(int fd, const LingerLimits& limits);

}  // namespace pdserve::http
