#include "server/node_registration.h"

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "common/logging.h"

namespace pdserve::server {

NodeRegistration::NodeRegistration(std::string router_url, std::string node_url,
                                   std::chrono::milliseconds interval)
    : router_url_(std::move(router_url)), node_url_(std::move(node_url)), interval_(interval) {
  thread_ = std::thread([this] { Run(); });
}

NodeRegistration::~NodeRegistration() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool NodeRegistration::RegisterOnce() {
  httplib::Client client(router_url_);
  client.set_connection_timeout(2, 0);
  client.set_read_timeout(2, 0);
  client.set_write_timeout(2, 0);
  const std::string body = nlohmann::json{{"url", node_url_}}.dump();
  auto res = client.Post("/internal/register", body, "application/json");
  return res && res->status >= 200 && res->status < 300;
}

void NodeRegistration::Run() {
  bool last_ok = true;
  bool first = true;
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    const bool ok = RegisterOnce();
    if (ok != last_ok || first) {
      if (ok) {
        PD_LOG_INFO("registered {} with router {}", node_url_, router_url_);
      } else {
        PD_LOG_WARN("cannot register {} with router {}; retrying every {} ms", node_url_,
                    router_url_, interval_.count());
      }
    }
    last_ok = ok;
    first = false;
    lock.lock();
    cv_.wait_for(lock, interval_, [this] { return stop_; });
  }
}

}  // namespace pdserve::server
