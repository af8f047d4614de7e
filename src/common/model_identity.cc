#include "common/model_identity.h"

#include <charconv>

#include <fmt/format.h>

#include "common/check.h"

namespace pdserve {
namespace {

constexpr int kConfigDigits = 16;

// Strips "key=" and the value up to the next ';' (or the end) off the front of `text`.
bool TakeField(std::string_view key, bool last, std::string_view* text, std::string_view* value) {
  if (text->substr(0, key.size()) != key || text->substr(key.size(), 1) != "=") return false;
  text->remove_prefix(key.size() + 1);
  const size_t end = text->find(';');
  if (last != (end == std::string_view::npos)) return false;
  *value = text->substr(0, end);
  text->remove_prefix(last ? text->size() : end + 1);
  return true;
}

}  // namespace

std::string ModelIdentity::Serialize() const {
  PD_CHECK(files.find(';') == std::string::npos && weights.find(';') == std::string::npos &&
           kv.find(';') == std::string::npos);
  return fmt::format("config={:016x};files={};weights={};kv={}", config, files, weights, kv);
}

Result<ModelIdentity> ModelIdentity::Parse(std::string_view text) {
  const Status bad = Status::InvalidArgument(fmt::format(
      "'{}' is not a model identity (config=<16 hex digits>;files=…;weights=…;kv=…)", text));
  std::string_view config, files, weights, kv;
  if (!TakeField("config", false, &text, &config) || !TakeField("files", false, &text, &files) ||
      !TakeField("weights", false, &text, &weights) || !TakeField("kv", true, &text, &kv)) {
    return bad;
  }
  if (config.size() != kConfigDigits ||
      config.find_first_not_of("0123456789abcdef") != std::string_view::npos) {
    return bad;
  }
  ModelIdentity identity;
  std::from_chars(config.data(), config.data() + config.size(), identity.config, 16);
  identity.files = std::string(files);
  identity.weights = std::string(weights);
  identity.kv = std::string(kv);
  return identity;
}

std::vector<std::string> ModelIdentity::Compare(const ModelIdentity& a, std::string_view a_name,
                                                const ModelIdentity& b, std::string_view b_name) {
  std::vector<std::string> differences;
  auto add = [&](std::string_view meaning, std::string_view key, std::string_view x,
                 std::string_view y) {
    differences.push_back(
        fmt::format("{}: {} {}={}, {} {}={}", meaning, a_name, key, x, b_name, key, y));
  };
  if (a.config != b.config) {
    add("model config differs (another architecture or shape)", "config",
        fmt::format("{:016x}", a.config), fmt::format("{:016x}", b.config));
  } else if (a.files != b.files) {
    add("model weights differ (another checkpoint)", "files", a.files, b.files);
  }
  if (a.weights != b.weights)
    add("weight dtype or format differs (--dtype/--weights: the KV would differ)", "weights",
        a.weights, b.weights);
  if (a.kv != b.kv) {
    add("speculation differs (--speculative mtp on one node only: the MTP module's KV layer "
        "would be missing)",
        "kv", a.kv, b.kv);
  }
  return differences;
}

}  // namespace pdserve
