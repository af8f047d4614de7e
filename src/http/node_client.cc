#include "http/node_client.h"

#include <httplib.h>

#include "http/cluster_auth.h"

namespace pdserve::http {
namespace {

std::pair<time_t, time_t> SecondsAndMicros(Duration d) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
  return {static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000)};
}

Result<NodeReply> Call(const NodeAddress& node, std::string_view method, std::string_view path,
                       std::string_view body, const NodeCallOptions& options) {
  httplib::Client client(node.host, node.port);
  const auto [connect_s, connect_us] = SecondsAndMicros(options.connect_timeout);
  const auto [s, us] = SecondsAndMicros(options.timeout);
  client.set_connection_timeout(connect_s, connect_us);
  client.set_read_timeout(s, us);
  client.set_write_timeout(s, us);
  // A request and its answer are a few small writes: without it each waits on delayed ACKs.
  client.set_tcp_nodelay(true);
  httplib::Headers headers;
  if (!options.cluster_key.empty()) {
    // The proof covers the path without its query, as the server checks it.
    const std::string_view bare = path.substr(0, path.find('?'));
    headers = ClusterAuthHeaders(options.cluster_key, method, bare, body);
  }
  const std::string target(path);
  httplib::Result res = method == "POST"
                            ? client.Post(target, headers, std::string(body), "application/json")
                            : client.Get(target, headers);
  if (!res) {
    return Status::Unavailable(std::string(method) + " " + node.url + target + ": " +
                               httplib::to_string(res.error()));
  }
  return NodeReply{res->status, std::move(res->body)};
}

}  // namespace

Result<NodeReply> NodeGet(const NodeAddress& node, std::string_view path,
                          const NodeCallOptions& options) {
  return Call(node, "GET", path, {}, options);
}

Result<NodeReply> NodePost(const NodeAddress& node, std::string_view path, std::string_view body,
                           const NodeCallOptions& options) {
  return Call(node, "POST", path, body, options);
}

Result<std::string> NodeGetOk(const NodeAddress& node, std::string_view path,
                              const NodeCallOptions& options) {
  PD_ASSIGN_OR_RETURN(NodeReply reply, NodeGet(node, path, options));
  if (reply.status != 200) {
    return Status::Unavailable("GET " + node.url + std::string(path) + ": HTTP " +
                               std::to_string(reply.status) + " " + reply.body.substr(0, 200));
  }
  return std::move(reply.body);
}

NodeAddress LocalNode(int port) {
  return NodeAddress{"127.0.0.1", port, "http://127.0.0.1:" + std::to_string(port)};
}

}  // namespace pdserve::http
