#include "bench/serve_client.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>
#include <httplib.h>

namespace pdserve::bench {
namespace {

using nlohmann::json;

void SetTimeouts(httplib::Client& client, Duration timeout) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  const auto connect_us = std::min<long long>(us, 10'000'000);
  client.set_connection_timeout(static_cast<time_t>(connect_us / 1000000),
                                static_cast<time_t>(connect_us % 1000000));
  // The read timeout bounds each silence; the receiver enforces the whole-request deadline.
  client.set_read_timeout(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
  client.set_write_timeout(30, 0);
  client.set_tcp_nodelay(true);
}

// The generated text a chunk carries, or nullopt for a chunk without choices (usage only).
std::optional<std::string> ChunkContent(const json& chunk, EndpointType endpoint) {
  const auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array() || choices->empty()) return std::nullopt;
  const json& choice = (*choices)[0];
  std::string text;
  auto take = [&text](const json& holder, const char* key) {
    const auto it = holder.find(key);
    if (it != holder.end() && it->is_string()) text += it->get<std::string>();
  };
  if (endpoint == EndpointType::kCompletions) {
    take(choice, "text");
  } else if (const auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
    take(*delta, "content");
    take(*delta, "reasoning_content");
  }
  return text;
}

// Reads one request's stream: splits SSE events and timestamps content chunks.
class StreamReader {
 public:
  StreamReader(EndpointType endpoint, TimePoint start, RequestOutcome* outcome)
      : endpoint_(endpoint), start_(start), outcome_(outcome) {}

  // Appends bytes that arrived at `now`; false once the stream can stop (error event).
  bool Feed(const char* data, size_t size, TimePoint now) {
    for (size_t i = 0; i < size; ++i) {
      if (data[i] != '\r') buffer_ += data[i];  // events end with a blank line, CRLF or LF
    }
    size_t end;
    while ((end = buffer_.find("\n\n")) != std::string::npos) {
      const std::string event = buffer_.substr(0, end);
      buffer_.erase(0, end + 2);
      if (!OnEvent(event, now)) return false;
    }
    return true;
  }

  bool done() const { return done_; }
  bool saw_content() const { return chunks_ > 0; }
  const std::string& error() const { return error_; }
  FailureKind error_kind() const { return error_kind_; }
  int usage_completion_tokens() const { return usage_completion_; }
  int usage_prompt_tokens() const { return usage_prompt_; }
  int content_chunks() const { return chunks_; }

 private:
  bool OnEvent(const std::string& event, TimePoint now) {
    std::string payload;
    size_t pos = 0;
    while (pos <= event.size()) {
      size_t nl = event.find('\n', pos);
      if (nl == std::string::npos) nl = event.size();
      std::string_view line(event.data() + pos, nl - pos);
      pos = nl + 1;
      if (line.rfind("data:", 0) != 0) continue;  // comments (": ping"), event:, id:
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      if (!payload.empty()) payload += '\n';
      payload += line;
    }
    if (payload.empty()) return true;
    if (payload == "[DONE]") {
      done_ = true;
      return true;
    }
    const json chunk = json::parse(payload, nullptr, /*allow_exceptions=*/false);
    if (chunk.is_discarded() || !chunk.is_object()) {
      error_ = "malformed stream chunk: " + payload.substr(0, 200);
      error_kind_ = FailureKind::kMalformedChunk;
      return false;
    }
    if (const auto err = chunk.find("error"); err != chunk.end() && !err->is_null()) {
      const auto msg = err->is_object() ? err->find("message") : err->end();
      error_ = "error event: " +
               (msg != err->end() && msg->is_string() ? msg->get<std::string>() : err->dump());
      error_kind_ = FailureKind::kErrorEvent;
      return false;
    }
    if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
      usage_completion_ = usage->value("completion_tokens", usage_completion_);
      usage_prompt_ = usage->value("prompt_tokens", usage_prompt_);
    }
    const std::optional<std::string> content = ChunkContent(chunk, endpoint_);
    if (content && !content->empty()) {
      const double t = std::chrono::duration<double>(now - start_).count();
      if (chunks_ == 0) {
        outcome_->ttft_s = t;
      } else {
        outcome_->itls_s.push_back(t - outcome_->e2el_s);
      }
      outcome_->e2el_s = t;
      ++chunks_;
    }
    return true;
  }

  const EndpointType endpoint_;
  const TimePoint start_;
  RequestOutcome* const outcome_;
  std::string buffer_;
  std::string error_;
  FailureKind error_kind_ = FailureKind::kNone;
  bool done_ = false;
  int chunks_ = 0;
  int usage_completion_ = 0;
  int usage_prompt_ = 0;
};

// An OpenAI-style error body: {"error": {"message": STRING, ...}}.
bool IsErrorJson(const std::string& body) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return false;
  const auto err = j.find("error");
  if (err == j.end() || !err->is_object()) return false;
  const auto msg = err->find("message");
  return msg != err->end() && msg->is_string();
}

std::string EndpointPath(const ServerAddress& server, EndpointType endpoint) {
  return server.path_prefix +
         (endpoint == EndpointType::kChat ? "/v1/chat/completions" : "/v1/completions");
}

}  // namespace

Result<ServerAddress> ParseBaseUrl(const std::string& base_url) {
  const size_t scheme_end = base_url.find("://");
  const std::string scheme = base_url.substr(0, scheme_end);
  if (scheme_end == std::string::npos || (scheme != "http" && scheme != "https") ||
      base_url.size() == scheme_end + 3) {
    return Status::InvalidArgument("--base-url must look like http://HOST:PORT, got '" + base_url +
                                   "'");
  }
  ServerAddress address;
  const size_t slash = base_url.find('/', scheme_end + 3);
  address.scheme_host_port = base_url.substr(0, slash);
  if (slash != std::string::npos) address.path_prefix = base_url.substr(slash);
  while (!address.path_prefix.empty() && address.path_prefix.back() == '/') {
    address.path_prefix.pop_back();
  }
  return address;
}

json StreamRequestBody(const StreamRequest& request) {
  json body = {{"model", request.model},
               {"max_tokens", request.max_tokens},
               {"temperature", 0.0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", true}};
  if (request.endpoint == EndpointType::kChat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", request.prompt}}});
  } else {
    body["prompt"] = request.prompt;
  }
  return body;
}

RequestOutcome StreamCompletion(const ServerAddress& server, const StreamRequest& request,
                                Duration timeout) {
  RequestOutcome outcome;
  outcome.prompt_len = request.prompt_len;
  httplib::Client client(server.scheme_host_port);
  SetTimeouts(client, timeout);

  httplib::Request req;
  req.method = "POST";
  req.path = EndpointPath(server, request.endpoint);
  req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  req.body = StreamRequestBody(request).dump();

  const TimePoint start = Clock::now();
  const Deadline deadline(start + timeout);
  StreamReader reader(request.endpoint, start, &outcome);
  int status = 0;
  std::string error_body;  // the body of a non-200 answer (its first 16 KiB), for the error
  bool timed_out = false;
  req.response_handler = [&status](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    const TimePoint now = Clock::now();
    if (status != 200) {
      error_body.append(data,
                        std::min<size_t>(size, 16384 - std::min<size_t>(16384, error_body.size())));
      return true;
    }
    if (now >= deadline.at()) {
      timed_out = true;
      return false;
    }
    return reader.Feed(data, size, now);
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  client.send(req, res, error);
  // httplib skips the response handler for bodiless answers; their status is in `res`.
  if (status == 0 && error == httplib::Error::Success) status = res.status;

  // A silence as long as the timeout ends in httplib's read error: report it as the timeout.
  if (error != httplib::Error::Success && Clock::now() >= deadline.at()) timed_out = true;
  if (timed_out) {
    outcome.error =
        fmt::format("timed out after {:.1f} s", std::chrono::duration<double>(timeout).count());
    outcome.failure = FailureKind::kTimeout;
  } else if (!reader.error().empty()) {
    outcome.error = reader.error();
    outcome.failure = reader.error_kind();
  } else if (status == 0) {
    outcome.error = "HTTP request failed: " + httplib::to_string(error);
    outcome.failure = FailureKind::kConnect;
  } else if (status != 200) {
    outcome.error = fmt::format("HTTP {}: {}", status, error_body.substr(0, 300));
    outcome.failure =
        IsErrorJson(error_body) ? FailureKind::kHttpError : FailureKind::kHttpErrorMalformed;
  } else if (error != httplib::Error::Success) {
    outcome.error = "stream broken: " + httplib::to_string(error);
    outcome.failure = FailureKind::kBroken;
  } else if (!reader.done()) {
    outcome.error = "stream ended without data: [DONE]";
    outcome.failure = FailureKind::kNoDone;
  } else if (!reader.saw_content()) {
    outcome.error = "stream carried no generated content";
    outcome.failure = FailureKind::kNoContent;
  }
  if (!outcome.error.empty()) return outcome;

  outcome.success = true;
  // Servers may put several tokens in one chunk: usage is the token count when reported.
  outcome.output_tokens = reader.usage_completion_tokens() > 0 ? reader.usage_completion_tokens()
                                                               : reader.content_chunks();
  if (outcome.prompt_len <= 0) outcome.prompt_len = reader.usage_prompt_tokens();
  return outcome;
}

Result<json> PostJson(const ServerAddress& server, const std::string& path, const json& body,
                      Duration timeout) {
  httplib::Client client(server.scheme_host_port);
  SetTimeouts(client, timeout);
  const std::string url = server.path_prefix + path;
  auto res = client.Post(url, body.dump(), "application/json");
  if (!res) {
    return Status::Unavailable(fmt::format("POST {}: {}", url, httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return Status::Unavailable(
        fmt::format("POST {}: HTTP {}: {}", url, res->status, res->body.substr(0, 300)));
  }
  json answer = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded()) return Status::ProtocolError("POST " + url + ": answer is not JSON");
  return answer;
}

Result<std::string> GetText(const ServerAddress& server, const std::string& path,
                            Duration timeout) {
  httplib::Client client(server.scheme_host_port);
  SetTimeouts(client, timeout);
  const std::string url = server.path_prefix + path;
  auto res = client.Get(url);
  if (!res) {
    return Status::Unavailable(fmt::format("GET {}: {}", url, httplib::to_string(res.error())));
  }
  if (res->status != 200) {
    return Status::Unavailable(
        fmt::format("GET {}: HTTP {}: {}", url, res->status, res->body.substr(0, 300)));
  }
  return std::move(res->body);
}

}  // namespace pdserve::bench
