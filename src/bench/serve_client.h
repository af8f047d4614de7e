// The HTTP side of `pdserve bench serve`: one streamed OpenAI request on its own connection,
// every SSE chunk timestamped on the monotonic clock as its bytes arrive, turned into a
// RequestOutcome. A request fails (never counts as fast) on a connection error, a timeout, a
// status other than 200, an error event in the stream, a stream that ends without
// "data: [DONE]", or one that carried no generated content.
// StreamCompletion is safe to call from many threads at once (each makes its own client).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "bench/serve_metrics.h"
#include "common/clock.h"
#include "common/status.h"

namespace pdserve::bench {

enum class EndpointType { kCompletions, kChat };

// Where the server is: "http[s]://HOST:PORT[/PREFIX]" split into its parts.
struct ServerAddress {
  std::string scheme_host_port;  // "http://HOST:PORT", what httplib::Client takes
  std::string path_prefix;       // "" or "/PREFIX" (no trailing slash)
};

// InvalidArgument for anything but http[s]://HOST[:PORT][/PATH].
Result<ServerAddress> ParseBaseUrl(const std::string& base_url);

struct StreamRequest {
  EndpointType endpoint = EndpointType::kCompletions;
  std::string model;
  std::string prompt;
  int prompt_len = 0;  // tokens; 0: take the server's usage.prompt_tokens
  int max_tokens = 0;  // the output length asked for (ignore_eos makes the server reach it)
};

// The request body: streamed, usage included, ignore_eos, greedy.
nlohmann::json StreamRequestBody(const StreamRequest& request);

// Sends `request` and reads its stream to the end or until `timeout` passes.
RequestOutcome StreamCompletion(const ServerAddress& server, const StreamRequest& request,
                                Duration timeout);

// Posts JSON `body` to PATH (prefix added) and returns the parsed JSON answer; errors for
// transport failures, non-200 answers (with the server's message) and bad JSON.
Result<nlohmann::json> PostJson(const ServerAddress& server, const std::string& path,
                                const nlohmann::json& body, Duration timeout);

// GETs PATH (prefix added) and returns the body of a 200 answer; errors for transport failures
// and other statuses.
Result<std::string> GetText(const ServerAddress& server, const std::string& path, Duration timeout);

}  // namespace pdserve::bench
