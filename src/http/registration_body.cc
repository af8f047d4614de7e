#include "http/registration_body.h"

#include <nlohmann/json.hpp>

namespace pdserve::http {
namespace {

ApiError Refused(std::string why) {
  return ApiError::InvalidRequest(
      "registration refused: " + std::move(why) + " (expected {\"url\": \"http://host:port\"})",
      "url", "invalid_registration");
}

}  // namespace

std::string RegistrationBody(const NodeAddress& node) {
  return nlohmann::json{{"url", node.url}}.dump();
}

ApiResult<NodeAddress> ParseRegistrationBody(std::string_view body) {
  const nlohmann::json json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Refused("the body is not JSON");
  if (!json.is_object()) return Refused("the body is not a JSON object");
  const auto url = json.find("url");
  if (url == json.end()) return Refused("no \"url\"");
  if (!url->is_string()) return Refused("\"url\" is not a string");
  Result<NodeAddress> address = ParseNodeUrl(url->get_ref<const std::string&>());
  if (!address.ok()) return Refused(address.status().message());
  return *std::move(address);
}

}  // namespace pdserve::http
