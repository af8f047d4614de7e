#include "router/router_upstream.h"

#include <algorithm>
#include <utility>

#include "http/server_setup.h"

namespace pdserve::router {
namespace {

// How often a long read looks at its abort flag.
constexpr auto kAbortCheckInterval = std::chrono::milliseconds(200);

}  // namespace

UpstreamExchange::UpstreamExchange(NodeAddress node, UpstreamTimeouts timeouts)
    : node_(std::move(node)), timeouts_(timeouts), client_(node_.host, node_.port) {
  http::SetTimeout(timeouts_.connect,
                   [&](time_t s, time_t us) { client_.set_connection_timeout(s, us); });
  http::SetTimeout(timeouts_.read, [&](time_t s, time_t us) { client_.set_read_timeout(s, us); });
  http::SetTimeout(timeouts_.write, [&](time_t s, time_t us) { client_.set_write_timeout(s, us); });
  // The router relays bytes as they are; decompressing would change what the client sees.
  client_.set_decompress(false);
  // A request leaves as head and body in two writes; with Nagle the body would wait for the
  // node's delayed ACK (~40 ms on every relayed request).
  client_.set_tcp_nodelay(true);
}

std::shared_ptr<UpstreamExchange> UpstreamExchange::Start(NodeAddress node, UpstreamRequest request,
                                                          UpstreamTimeouts timeouts) {
  std::shared_ptr<UpstreamExchange> exchange(new UpstreamExchange(std::move(node), timeouts));
  // The thread uses `this` only; the destructor joins it, so it never outlives the object.
  exchange->thread_ =
      std::thread([e = exchange.get(), r = std::move(request)]() mutable { e->Run(std::move(r)); });
  return exchange;
}

UpstreamExchange::~UpstreamExchange() {
  Cancel();
  if (thread_.joinable()) thread_.join();
}

void UpstreamExchange::Run(UpstreamRequest request) {
  httplib::Request req;
  req.method = std::move(request.method);
  req.path = std::move(request.path);
  req.headers = std::move(request.headers);
  req.body = std::move(request.body);
  req.response_handler = [this](const httplib::Response& r) { return OnHead(r); };
  req.content_receiver = [this](const char* data, size_t size, uint64_t, uint64_t) {
    return OnData(data, size);
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  client_.send(req, res, error);
  Finish(error, res);
}

bool UpstreamExchange::OnHead(const httplib::Response& response) {
  MutexLock lock(&mu_);
  head_ = UpstreamHead{response.status, response.headers};
  cv_.NotifyAll();
  return !cancelled_;
}

bool UpstreamExchange::OnData(const char* data, size_t size) {
  MutexLock lock(&mu_);
  // Back-pressure: wait for the consumer rather than buffer a whole slow stream. No deadline of
  // its own: the consumer pops or cancels (its reads have deadlines; the destructor cancels).
  while (!cancelled_ && buffered_ > timeouts_.max_buffered_bytes) {
    cv_.WaitFor(&mu_, std::chrono::milliseconds(100));
  }
  if (cancelled_) return false;
  pieces_.emplace_back(data, size);
  buffered_ += size;
  cv_.NotifyAll();
  return true;
}

void UpstreamExchange::Finish(httplib::Error error, const httplib::Response& response) {
  MutexLock lock(&mu_);
  done_ = true;
  // httplib skips the response handler for bodiless answers (204); their head is in `response`.
  if (error == httplib::Error::Success && !head_.has_value()) {
    head_ = UpstreamHead{response.status, response.headers};
  }
  if (cancelled_) {
    // What arrived before a cancel is not the whole answer: readers must not take it for one.
    error_ = "cancelled";
  } else if (error != httplib::Error::Success) {
    error_ = httplib::to_string(error);
    connect_failed_ = !head_.has_value() && (error == httplib::Error::Connection ||
                                             error == httplib::Error::ConnectionTimeout);
  }
  cv_.NotifyAll();
}

Result<UpstreamHead> UpstreamExchange::WaitHead(Deadline deadline) {
  MutexLock lock(&mu_);
  while (!head_.has_value() && !done_) {
    if (cv_.WaitUntil(&mu_, deadline.at()) == std::cv_status::timeout) break;
  }
  if (head_.has_value()) return *head_;
  if (done_) {
    return Status::Unavailable(node_.url + ": " + (error_.empty() ? "no response" : error_));
  }
  return Status::DeadlineExceeded(node_.url + ": no response head before the deadline");
}

UpstreamExchange::Next UpstreamExchange::Pop(std::string* data, Deadline deadline) {
  MutexLock lock(&mu_);
  while (pieces_.empty() && !done_) {
    if (cv_.WaitUntil(&mu_, deadline.at()) == std::cv_status::timeout) break;
  }
  if (!pieces_.empty()) {
    *data = std::move(pieces_.front());
    pieces_.pop_front();
    buffered_ -= data->size();
    cv_.NotifyAll();  // wakes a producer held back by back-pressure
    return Next::kData;
  }
  if (!done_) return Next::kTimeout;
  if (!error_.empty()) {
    *data = error_;
    return Next::kError;
  }
  return Next::kEnd;
}

Result<std::string> UpstreamExchange::ReadAll(Deadline deadline, size_t limit,
                                              const std::atomic<bool>* abort) {
  std::string body;
  std::string piece;
  for (;;) {
    const Deadline slice(std::min(deadline.at(), Clock::now() + kAbortCheckInterval));
    switch (Pop(&piece, slice)) {
      case Next::kData:
        body += piece;
        if (body.size() > limit) {
          Cancel();
          return Status::ResourceExhausted(node_.url + ": response body exceeds the limit");
        }
        break;
      case Next::kEnd:
        return body;
      case Next::kTimeout:
        if (abort != nullptr && abort->load()) {
          Cancel();
          return Status::Cancelled(node_.url + ": abandoned (router stopping)");
        }
        if (!deadline.Passed()) break;
        Cancel();
        return Status::DeadlineExceeded(node_.url + ": response body not complete in time");
      case Next::kError:
        return Status::Unavailable(node_.url + ": " + piece);
    }
  }
}

void UpstreamExchange::Cancel() {
  {
    MutexLock lock(&mu_);
    if (done_ || cancelled_) return;
    cancelled_ = true;
    cv_.NotifyAll();
  }
  // Unblocks a read waiting on the node; the receiver then returns false and the connection
  // closes, which the node sees as a client disconnect.
  client_.stop();
}

bool UpstreamExchange::connect_failed() const {
  MutexLock lock(&mu_);
  return connect_failed_;
}

}  // namespace pdserve::router
