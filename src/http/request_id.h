// The request-id policy shared by router and node. A request travels under one id from the
// router's front door to the node's log: the router keeps a client's X-Request-Id only if it
// is short and made of safe characters (so it can be logged and forwarded as is), otherwise it
// makes a new one; it forwards the id it chose, and the node, applying the same policy,
// keeps it. Pure functions; safe from any thread.
#pragma once

#include <string>
#include <string_view>

namespace pdserve::http {

inline constexpr char kRequestIdHeader[] = "X-Request-Id";
// Longest client id kept; a UUID (36) or a typical trace id fits.
inline constexpr size_t kMaxRequestIdLength = 64;

// True if `id` is 1..kMaxRequestIdLength characters of [A-Za-z0-9._:-].
bool IsSafeRequestId(std::string_view id);
// A fresh id, "req-" and 16 random hex digits (always safe).
std::string NewRequestId();
// The id a request travels under: `client_id` if safe, else a fresh one.
std::string ChooseRequestId(std::string_view client_id);

}  // namespace pdserve::http
