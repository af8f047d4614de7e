#include "router/router_nodes.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace pdserve::router {

NodePool::NodePool(NodePoolOptions options) : options_(options) {}

NodePool::Node* NodePool::FindLocked(const std::string& url) {
  for (Node& node : nodes_) {
    if (node.address.url == url) return &node;
  }
  return nullptr;
}

Status NodePool::AddStatic(std::string_view url) {
  PD_ASSIGN_OR_RETURN(NodeAddress address, ParseNodeUrl(url));
  MutexLock lock(&mu_);
  if (Node* node = FindLocked(address.url)) {
    node->registered = false;  // a command-line node never expires
    node->is_static = true;
    node->withdrawn = false;
    return Status::Ok();
  }
  Node node;
  node.address = std::move(address);
  node.is_static = true;
  nodes_.push_back(std::move(node));
  return Status::Ok();
}

Result<bool> NodePool::Register(std::string_view url, TimePoint now) {
  PD_ASSIGN_OR_RETURN(NodeAddress address, ParseNodeUrl(url));
  MutexLock lock(&mu_);
  if (Node* node = FindLocked(address.url)) {
    node->last_registration = now;
    if (!node->is_static) node->registered = true;  // a member also registering itself
    node->withdrawn = false;
    return false;
  }
  Node node;
  node.address = std::move(address);
  node.registered = true;
  node.last_registration = now;
  nodes_.push_back(std::move(node));
  return true;
}

bool NodePool::SetMembers(const std::vector<std::string>& urls) {
  std::vector<std::string> listed;
  for (const std::string& url : urls) {
    if (Result<NodeAddress> address = ParseNodeUrl(url); address.ok())
      listed.push_back(address->url);
  }
  MutexLock lock(&mu_);
  bool added = false;
  for (const std::string& url : listed) {
    if (Node* node = FindLocked(url)) {
      node->member = true;
      node->withdrawn = false;
      continue;
    }
    Node node;
    node.address = *ParseNodeUrl(url);
    node.member = true;
    nodes_.push_back(std::move(node));
    added = true;
  }
  for (Node& node : nodes_) {
    if (!node.member || std::find(listed.begin(), listed.end(), node.address.url) != listed.end()) {
      continue;
    }
    node.member = false;
    // A self-registered node keeps its registration's own expiry.
    if (!node.is_static && !node.registered) node.withdrawn = true;
  }
  // The urls of the nodes dropped are gathered outside removed_: the analysis cannot see that a
  // lambda runs under mu_.
  std::vector<std::string> gone;
  std::erase_if(nodes_, [&gone](const Node& node) {
    if (!node.withdrawn || node.outstanding != 0) return false;
    gone.push_back(node.address.url);
    return true;
  });
  removed_.insert(removed_.end(), gone.begin(), gone.end());
  if (next_ >= nodes_.size()) next_ = 0;
  return added;
}

void NodePool::ExpireRegistrations(TimePoint now) {
  MutexLock lock(&mu_);
  std::vector<std::string> gone;  // as in SetMembers
  std::erase_if(nodes_, [&](const Node& node) {
    if (node.outstanding != 0) return false;
    const bool expired =
        node.withdrawn || (node.registered && !node.member &&
                           now - node.last_registration > options_.registration_ttl);
    if (expired) gone.push_back(node.address.url);
    return expired;
  });
  removed_.insert(removed_.end(), gone.begin(), gone.end());
  if (next_ >= nodes_.size()) next_ = 0;
}

std::vector<std::string> NodePool::TakeRemoved() {
  MutexLock lock(&mu_);
  return std::exchange(removed_, {});
}

std::optional<NodeAddress> NodePool::Acquire(
    const std::vector<std::string>& exclude,
    const std::function<double(const std::string&)>& bonus) {
  MutexLock lock(&mu_);
  const size_t n = nodes_.size();
  Node* best = nullptr;
  size_t best_index = 0;
  std::pair<bool, double> best_key;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (next_ + k) % n;
    Node& node = nodes_[i];
    if (!node.healthy || node.withdrawn) continue;
    if (std::find(exclude.begin(), exclude.end(), node.address.url) != exclude.end()) continue;
    // Not degraded first; then strictly lower cost wins, so among equals the first after
    // next_ does: round robin on ties.
    const std::pair<bool, double> key(!node.degraded.empty(),
                                      node.outstanding - (bonus ? bonus(node.address.url) : 0.0));
    if (best == nullptr || key < best_key) {
      best = &node;
      best_index = i;
      best_key = key;
    }
  }
  if (best == nullptr) return std::nullopt;
  next_ = best_index + 1;
  ++best->outstanding;
  ++best->requests;
  return best->address;
}

void NodePool::Release(const std::string& url) {
  MutexLock lock(&mu_);
  // The node may have been dropped meanwhile; then there is nothing to count down.
  if (Node* node = FindLocked(url); node != nullptr && node->outstanding > 0) --node->outstanding;
}

bool NodePool::ReportHealthy(const std::string& url, const std::string& degraded) {
  MutexLock lock(&mu_);
  Node* node = FindLocked(url);
  if (node == nullptr) return false;
  const bool changed = !node->healthy || node->degraded.empty() != degraded.empty();
  node->healthy = true;
  node->degraded = degraded;
  node->consecutive_failures = 0;
  return changed;
}

bool NodePool::ReportUnhealthy(const std::string& url) {
  MutexLock lock(&mu_);
  Node* node = FindLocked(url);
  if (node == nullptr) return false;
  if (node->consecutive_failures < std::numeric_limits<int>::max()) ++node->consecutive_failures;
  if (node->consecutive_failures < options_.failures_to_down || !node->healthy) return false;
  node->healthy = false;
  return true;
}

void NodePool::ReportConnectFailure(const std::string& url) {
  MutexLock lock(&mu_);
  if (Node* node = FindLocked(url)) {
    node->healthy = false;
    node->consecutive_failures = std::max(node->consecutive_failures, options_.failures_to_down);
  }
}

std::vector<NodeAddress> NodePool::Addresses() const {
  MutexLock lock(&mu_);
  std::vector<NodeAddress> out;
  for (const Node& node : nodes_) out.push_back(node.address);
  return out;
}

std::vector<NodeSnapshot> NodePool::Snapshot() const {
  MutexLock lock(&mu_);
  std::vector<NodeSnapshot> out;
  for (const Node& node : nodes_) {
    out.push_back({.url = node.address.url,
                   .healthy = node.healthy,
                   .degraded = node.healthy ? node.degraded : "",
                   .registered = node.registered,
                   .member = node.member,
                   .outstanding = node.outstanding,
                   .requests = node.requests,
                   .consecutive_failures = node.consecutive_failures});
  }
  return out;
}

int NodePool::HealthyCount() const {
  MutexLock lock(&mu_);
  return static_cast<int>(
      std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.healthy; }));
}

int NodePool::DegradedCount() const {
  MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) {
    return n.healthy && !n.degraded.empty();
  }));
}

int NodePool::Size() const {
  MutexLock lock(&mu_);
  return static_cast<int>(nodes_.size());
}

}  // namespace pdserve::router
