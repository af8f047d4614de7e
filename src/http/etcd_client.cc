#include "http/etcd_client.h"

#include <array>
#include <utility>

#include <httplib.h>

#include "http/node_url.h"

namespace pdserve::http {
namespace {

constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// etcd's gateway writes int64 fields as JSON strings ("revision": "12"); absent means 0.
int64_t Int64Field(const nlohmann::json& object, const char* name) {
  if (!object.is_object()) return 0;
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (const std::exception&) {
      return 0;
    }
  }
  return 0;
}

Result<EtcdKeyValue> ParseKeyValue(const nlohmann::json& kv) {
  EtcdKeyValue out;
  PD_ASSIGN_OR_RETURN(out.key, Base64Decode(kv.value("key", "")));
  PD_ASSIGN_OR_RETURN(out.value, Base64Decode(kv.value("value", "")));
  out.mod_revision = Int64Field(kv, "mod_revision");
  out.lease = Int64Field(kv, "lease");
  return out;
}

// Why the gateway refused a call: its {"error": ..., "message": ..., "code": N} body.
Status GatewayError(std::string_view path, int status, const std::string& body) {
  std::string message = body.substr(0, 300);
  try {
    const nlohmann::json j = nlohmann::json::parse(body);
    if (j.is_object()) {
      if (j.contains("message")) message = j["message"].dump();
      if (j.contains("error") && j["error"].is_string()) message = j["error"].get<std::string>();
    }
  } catch (const nlohmann::json::exception&) {
  }
  return Status::Unavailable("etcd " + std::string(path) + ": HTTP " + std::to_string(status) +
                             " " + message);
}

// Splits a stream of concatenated JSON objects (the gateway writes one per message, each on a
// line of its own) into whole objects: depth counting outside strings.
class JsonObjectSplitter {
 public:
  // Feeds bytes; each complete top-level object goes to `on_object` (false: stop).
  bool Feed(const char* data, size_t n, const std::function<bool(std::string_view)>& on_object) {
    for (size_t i = 0; i < n; ++i) {
      const char c = data[i];
      if (depth_ == 0 && c != '{') continue;  // whitespace between objects
      buffer_.push_back(c);
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{') {
        ++depth_;
      } else if (c == '}' && --depth_ == 0) {
        const bool go_on = on_object(buffer_);
        buffer_.clear();
        if (!go_on) return false;
      }
    }
    return true;
  }

 private:
  std::string buffer_;
  int depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

}  // namespace

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += kBase64Alphabet[(v >> 6) & 63];
    out += kBase64Alphabet[v & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v =
        (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8);
    out += kBase64Alphabet[(v >> 18) & 63];
    out += kBase64Alphabet[(v >> 12) & 63];
    out += kBase64Alphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  std::array<int, 256> value;
  value.fill(-1);
  for (int i = 0; i < 64; ++i) value[static_cast<uint8_t>(kBase64Alphabet[i])] = i;
  if (text.size() % 4 != 0) {
    return Status::InvalidArgument("base64 text of " + std::to_string(text.size()) +
                                   " characters (not a multiple of 4)");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      v[k] = pad > 0 ? -1 : value[static_cast<uint8_t>(c)];
      if (v[k] < 0) return Status::InvalidArgument("not base64: '" + std::string(text) + "'");
    }
    const uint32_t bits = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += static_cast<char>((bits >> 16) & 0xff);
    if (pad < 2) out += static_cast<char>((bits >> 8) & 0xff);
    if (pad < 1) out += static_cast<char>(bits & 0xff);
  }
  return out;
}

std::string PrefixRangeEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<uint8_t>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<uint8_t>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key (etcd's convention)
}

Result<std::vector<std::string>> ParseEtcdEndpoints(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    const std::string_view item = list.substr(start, comma - start);
    if (!item.empty()) {
      Result<NodeAddress> address = ParseNodeUrl(item);
      if (!address.ok()) {
        return Status::InvalidArgument("--etcd endpoint '" + std::string(item) +
                                       "': " + address.status().message());
      }
      out.push_back(address->url);
    }
    start = comma + 1;
  }
  if (out.empty()) return Status::InvalidArgument("--etcd needs at least one URL");
  return out;
}

Result<EtcdWatchResponse> ParseWatchResponse(const nlohmann::json& message) {
  if (!message.is_object()) return Status::InvalidArgument("etcd watch: not a JSON object");
  if (message.contains("error")) {
    return Status::Unavailable("etcd watch: " + message["error"].dump().substr(0, 300));
  }
  const nlohmann::json& r = message.contains("result") ? message["result"] : message;
  EtcdWatchResponse out;
  if (r.contains("header")) out.header_revision = Int64Field(r["header"], "revision");
  out.created = r.value("created", false);
  out.canceled = r.value("canceled", false);
  out.compact_revision = Int64Field(r, "compact_revision");
  out.cancel_reason = r.value("cancel_reason", "");
  if (r.contains("events") && r["events"].is_array()) {
    for (const nlohmann::json& e : r["events"]) {
      EtcdEvent event;
      event.deleted = e.value("type", "PUT") == "DELETE";
      if (!e.contains("kv")) continue;
      PD_ASSIGN_OR_RETURN(event.kv, ParseKeyValue(e["kv"]));
      out.events.push_back(std::move(event));
    }
  }
  return out;
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, EtcdTimeouts timeouts)
    : endpoints_(std::move(endpoints)), timeouts_(timeouts) {}

EtcdClient::~EtcdClient() { StopWatch(); }

std::string EtcdClient::endpoint() const {
  MutexLock lock(&mu_);
  return endpoints_.empty() ? "" : endpoints_[current_];
}

Result<nlohmann::json> EtcdClient::Call(std::string_view path, const nlohmann::json& body) {
  if (endpoints_.empty()) return Status::FailedPrecondition("no etcd endpoint");
  size_t first;
  {
    MutexLock lock(&mu_);
    first = current_;
  }
  Status last = Status::Unavailable("etcd unreachable");
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t i = (first + k) % endpoints_.size();
    httplib::Client client(endpoints_[i]);
    client.set_connection_timeout(timeouts_.connect);
    client.set_read_timeout(timeouts_.call);
    client.set_write_timeout(timeouts_.call);
    auto res = client.Post(std::string(path), body.dump(), "application/json");
    if (!res) {
      last = Status::Unavailable("etcd " + endpoints_[i] + " unreachable (" +
                                 httplib::to_string(res.error()) + ")");
      continue;  // the next member
    }
    {
      MutexLock lock(&mu_);
      current_ = i;
    }
    if (res->status != 200) return GatewayError(path, res->status, res->body);
    try {
      return nlohmann::json::parse(res->body);
    } catch (const nlohmann::json::exception& e) {
      return Status::Unavailable("etcd " + std::string(path) + ": not JSON (" + e.what() + ")");
    }
  }
  return last;
}

Result<int64_t> EtcdClient::GrantLease(int ttl_s) {
  PD_ASSIGN_OR_RETURN(nlohmann::json r, Call("/v3/lease/grant", {{"TTL", std::to_string(ttl_s)}}));
  const int64_t id = Int64Field(r, "ID");
  if (id == 0) return Status::Unavailable("etcd granted no lease: " + r.dump().substr(0, 200));
  return id;
}

Result<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  PD_ASSIGN_OR_RETURN(nlohmann::json r,
                      Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}));
  // The gateway answers {"result": {..., "TTL": "n"}}; an expired lease has no TTL (0).
  const nlohmann::json& result = r.contains("result") ? r["result"] : r;
  const int64_t ttl = Int64Field(result, "TTL");
  if (ttl <= 0) return Status::NotFound("etcd lease " + std::to_string(lease) + " expired");
  return ttl;
}

Status EtcdClient::Revoke(int64_t lease) {
  return Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}).status();
}

Status EtcdClient::Put(std::string_view key, std::string_view value, int64_t lease) {
  nlohmann::json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return Call("/v3/kv/put", body).status();
}

Result<EtcdRange> EtcdClient::RangePrefix(std::string_view prefix) {
  PD_ASSIGN_OR_RETURN(nlohmann::json r,
                      Call("/v3/kv/range", {{"key", Base64Encode(prefix)},
                                            {"range_end", Base64Encode(PrefixRangeEnd(prefix))}}));
  EtcdRange out;
  if (r.contains("header")) out.revision = Int64Field(r["header"], "revision");
  if (r.contains("kvs") && r["kvs"].is_array()) {
    for (const nlohmann::json& kv : r["kvs"]) {
      PD_ASSIGN_OR_RETURN(EtcdKeyValue parsed, ParseKeyValue(kv));
      out.kvs.push_back(std::move(parsed));
    }
  }
  return out;
}

Status EtcdClient::Delete(std::string_view key) {
  return Call("/v3/kv/deleterange", {{"key", Base64Encode(key)}}).status();
}

Status EtcdClient::Watch(std::string_view prefix, int64_t start_revision,
                         const std::function<bool(const EtcdWatchResponse&)>& on_response) {
  if (endpoints_.empty()) return Status::FailedPrecondition("no etcd endpoint");
  const std::string url = endpoint();
  auto client = std::make_unique<httplib::Client>(url);
  client->set_connection_timeout(timeouts_.connect);
  client->set_read_timeout(timeouts_.watch_idle);
  client->set_write_timeout(timeouts_.call);
  {
    MutexLock lock(&mu_);
    if (stopped_) return Status::Cancelled("etcd watch stopped");
    watching_.insert(client.get());
  }
  nlohmann::json create = {{"key", Base64Encode(prefix)},
                           {"range_end", Base64Encode(PrefixRangeEnd(prefix))}};
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v3/watch";
  req.set_header("Content-Type", "application/json");
  req.body = nlohmann::json{{"create_request", create}}.dump();
  Status ended = Status::Unavailable("etcd watch stream from " + url + " ended");
  bool handler_stopped = false;
  JsonObjectSplitter splitter;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    {
      MutexLock lock(&mu_);
      if (stopped_) return false;
    }
    return splitter.Feed(data, n, [&](std::string_view text) {
      nlohmann::json message;
      try {
        message = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        ended = Status::Unavailable(std::string("etcd watch: bad JSON: ") + e.what());
        return false;
      }
      Result<EtcdWatchResponse> parsed = ParseWatchResponse(message);
      if (!parsed.ok()) {
        ended = parsed.status();
        return false;
      }
      if (!on_response(*parsed)) {
        handler_stopped = true;
        return false;
      }
      return true;
    });
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client->send(req, res, error);
  bool stopped;
  {
    MutexLock lock(&mu_);
    watching_.erase(client.get());
    stopped = stopped_;
  }
  if (stopped) return Status::Cancelled("etcd watch stopped");
  if (handler_stopped) return Status::Ok();
  if (!sent && error == httplib::Error::Read) {
    return Status::DeadlineExceeded(
        "etcd watch silent for " +
        std::to_string(
            std::chrono::duration_cast<std::chrono::milliseconds>(timeouts_.watch_idle).count()) +
        " ms");
  }
  if (!sent) {
    // The next call (a range, a keep-alive) moves on to another member if this one is gone.
    MutexLock lock(&mu_);
    if (endpoints_.size() > 1 && endpoints_[current_] == url) {
      current_ = (current_ + 1) % endpoints_.size();
    }
    return Status::Unavailable("etcd watch on " + url + ": " + httplib::to_string(error));
  }
  if (res.status != 200) return GatewayError("/v3/watch", res.status, res.body);
  return ended;
}

void EtcdClient::StopWatch() {
  MutexLock lock(&mu_);
  stopped_ = true;
  for (httplib::Client* client : watching_) client->stop();
}

}  // namespace pdserve::http
