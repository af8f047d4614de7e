#include "http/node_url.h"

#include <charconv>

namespace pdserve::http {

Result<NodeAddress> ParseNodeUrl(std::string_view text) {
  const std::string original(text);
  if (text.starts_with("https://")) {
    return Status::InvalidArgument("node url '" + original + "': https is not supported");
  }
  if (text.starts_with("http://")) text.remove_prefix(7);
  if (text.ends_with('/')) text.remove_suffix(1);
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return Status::InvalidArgument("node url '" + original + "': expected http://host:port");
  }
  std::string_view host = text.substr(0, colon);
  std::string_view port_text = text.substr(colon + 1);
  if (host.find_first_of("/?# ") != std::string_view::npos) {
    return Status::InvalidArgument("node url '" + original + "': bad host");
  }
  int port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port <= 0 ||
      port > 65535) {
    return Status::InvalidArgument("node url '" + original + "': bad port");
  }
  NodeAddress address;
  address.host = std::string(host);
  address.port = port;
  address.url = "http://" + address.host + ":" + std::to_string(port);
  return address;
}

}  // namespace pdserve::http
