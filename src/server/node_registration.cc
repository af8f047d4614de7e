#include "server/node_registration.h"

#include "common/logging.h"
#include "http/node_client.h"
#include "http/node_url.h"
#include "http/registration_body.h"

namespace pdserve::server {

NodeRegistration::NodeRegistration(std::string router_url, std::string node_url,
                                   std::string cluster_key, std::chrono::milliseconds interval,
                                   std::string path)
    : router_url_(std::move(router_url)),
      node_url_(std::move(node_url)),
      cluster_key_(std::move(cluster_key)),
      path_(std::move(path)),
      interval_(interval) {
  thread_ = std::thread([this] { Run(); });
}

NodeRegistration::~NodeRegistration() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

Status NodeRegistration::RegisterOnce() {
  PD_ASSIGN_OR_RETURN(http::NodeAddress router, http::ParseNodeUrl(router_url_));
  PD_ASSIGN_OR_RETURN(http::NodeAddress node, http::ParseNodeUrl(node_url_));
  http::NodeCallOptions options;
  options.connect_timeout = std::chrono::seconds(2);
  options.timeout = std::chrono::seconds(2);
  options.cluster_key = cluster_key_;
  PD_ASSIGN_OR_RETURN(http::NodeReply res,
                      http::NodePost(router, path_, http::RegistrationBody(node), options));
  if (res.status < 200 || res.status >= 300) {
    // A refused proof (401/403) names a wrong or missing cluster key: worth the log line.
    return Status::Unavailable("HTTP " + std::to_string(res.status) + " " +
                               res.body.substr(0, 200));
  }
  return Status::Ok();
}

bool NodeRegistration::StopRequestedBy(TimePoint deadline) {
  MutexLock lock(&mu_);
  while (!stop_) {
    if (cv_.WaitUntil(&mu_, deadline) == std::cv_status::timeout) break;
  }
  return stop_;
}

void NodeRegistration::Run() {
  bool last_ok = true;
  bool first = true;
  // The first round registers at once; later ones wait an interval (or for the destructor).
  for (TimePoint next = Clock::now(); !StopRequestedBy(next); next = Clock::now() + interval_) {
    const Status status = RegisterOnce();
    const bool ok = status.ok();
    if (ok != last_ok || first) {
      if (ok) {
        PD_LOG_INFO("registered {} at {}{}", node_url_, router_url_, path_);
      } else {
        PD_LOG_WARN("cannot register {} at {}{} ({}); retrying every {} ms", node_url_, router_url_,
                    path_, status.message(), interval_.count());
      }
    }
    last_ok = ok;
    first = false;
  }
}

}  // namespace pdserve::server
