// Tokenizer::Load (picks the implementation and applies tokenizer_config.json and
// generation_config.json) and IncrementalDecoder.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/sentencepiece.h"
#include "tokenizer/utf8.h"

namespace pdserve {
namespace {

using nlohmann::json;

Result<json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Status::IoError("cannot open " + path);
  std::string text(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(text.data(), static_cast<std::streamsize>(text.size()))) {
    return Status::IoError("cannot read " + path);
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(path + ": not valid JSON (truncated?): " + e.what());
  }
}

// Reads an optional JSON object file: null if absent.
Result<json> ReadOptionalObject(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return json();
  PD_ASSIGN_OR_RETURN(json value, ReadJsonFile(path.string()));
  if (!value.is_object()) return Status::InvalidArgument(path.string() + ": must be an object");
  return value;
}

// tokenizer_config.json writes a token as "text" or as {"content": "text", ...}.
std::optional<std::string> TokenText(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

// Token ids in config files are an integer or a list of integers.
Result<std::vector<int32_t>> IdList(const json& value, const std::string& what,
                                    int32_t vocab_size) {
  std::vector<int32_t> ids;
  const json list = value.is_array() ? value : json::array({value});
  for (const json& id : list) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size) {
      return Status::InvalidArgument(what + " holds " + id.dump() + ", not a token id below " +
                                     std::to_string(vocab_size));
    }
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

// The chat template is a string or, in some files, a list of {name, template}.
std::string ChatTemplate(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) return "";
  std::string first;
  for (const json& entry : value) {
    if (!entry.is_object() || !entry.contains("template") || !entry["template"].is_string()) {
      continue;
    }
    if (entry.contains("name") && entry["name"] == "default") {
      return entry["template"].get<std::string>();
    }
    if (first.empty()) first = entry["template"].get<std::string>();
  }
  return first;
}

Result<std::unique_ptr<Tokenizer>> LoadModel(const std::filesystem::path& dir) {
  const std::filesystem::path json_path = dir / "tokenizer.json";
  const std::filesystem::path sp_path = dir / "tokenizer.model";
  const bool has_sp = std::filesystem::exists(sp_path);
  if (std::filesystem::exists(json_path)) {
    PD_ASSIGN_OR_RETURN(json file, ReadJsonFile(json_path.string()));
    Result<std::unique_ptr<Tokenizer>> bpe = LoadByteLevelBpe(file, json_path.string());
    // A tokenizer.json that is not byte-level BPE usually sits next to the tokenizer.model
    // it was converted from.
    if (bpe.ok() || bpe.status().code() != StatusCode::kUnimplemented || !has_sp) return bpe;
  }
  if (has_sp) return LoadSentencePiece(sp_path.string());
  return Status::NotFound("no tokenizer.json or tokenizer.model in " + dir.string());
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  try {
    const std::filesystem::path dir(model_dir);
    PD_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadModel(dir));
    PD_RETURN_IF_ERROR(tokenizer->ApplyConfigs(dir));
    return tokenizer;
  } catch (const std::exception& e) {  // a safety net: parsing code checks types first
    return Status::InvalidArgument("tokenizer in " + model_dir + ": " + e.what());
  }
}

Status Tokenizer::ApplyConfigs(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  PD_ASSIGN_OR_RETURN(json config, ReadOptionalObject(config_path));
  const std::string where = config_path.string();
  const int32_t vocab = vocab_size();
  if (config.is_object()) {
    if (auto text = TokenText(config.value("bos_token", json()))) {
      if (auto id = TokenToId(*text)) bos_id_ = *id;
    }
    if (auto text = TokenText(config.value("eos_token", json()))) {
      if (auto id = TokenToId(*text)) eos_ids_ = {*id};
    }
    if (config.contains("bos_token_id") && !config["bos_token_id"].is_null()) {
      PD_ASSIGN_OR_RETURN(auto ids,
                          IdList(config["bos_token_id"], where + ": bos_token_id", vocab));
      if (ids.size() == 1) bos_id_ = ids[0];
    }
    if (config.contains("eos_token_id") && !config["eos_token_id"].is_null()) {
      PD_ASSIGN_OR_RETURN(eos_ids_,
                          IdList(config["eos_token_id"], where + ": eos_token_id", vocab));
    }
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      add_bos_ = config["add_bos_token"].get<bool>();
    }
    if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) {
      add_eos_ = config["add_eos_token"].get<bool>();
    }
    chat_template_ = ChatTemplate(config.value("chat_template", json()));
  }
  // generation_config.json lists every id that ends a generation (e.g. <|im_end|> too).
  const std::filesystem::path gen_path = dir / "generation_config.json";
  PD_ASSIGN_OR_RETURN(json gen, ReadOptionalObject(gen_path));
  if (gen.is_object() && gen.contains("eos_token_id") && !gen["eos_token_id"].is_null()) {
    PD_ASSIGN_OR_RETURN(auto ids,
                        IdList(gen["eos_token_id"], gen_path.string() + ": eos_token_id", vocab));
    for (int32_t id : ids) {
      if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
    }
  }
  if (!bos_id_ && gen.is_object() && gen.contains("bos_token_id") &&
      gen["bos_token_id"].is_number()) {
    PD_ASSIGN_OR_RETURN(auto ids,
                        IdList(gen["bos_token_id"], gen_path.string() + ": bos_token_id", vocab));
    bos_id_ = ids[0];
  }
  if (!bos_id_) add_bos_ = false;
  if (eos_ids_.empty()) add_eos_ = false;
  if (bos_id_) bos_token_ = TokenBytes(*bos_id_);
  if (!eos_ids_.empty()) eos_token_ = TokenBytes(eos_ids_.front());
  return Status::Ok();
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (InRange(id) && !(skip_special && special_[id] != 0)) out += token_bytes_[id];
  }
  return out;
}

std::vector<int32_t> Tokenizer::WithSpecials(std::vector<int32_t> ids) const {
  if (add_bos_ && bos_id_) ids.insert(ids.begin(), *bos_id_);
  if (add_eos_ && !eos_ids_.empty()) ids.push_back(eos_ids_.front());
  return ids;
}

std::string IncrementalDecoder::Append(int32_t id) {
  if (id < 0 || id >= tokenizer_->vocab_size()) return "";
  if (skip_special_ && tokenizer_->IsSpecial(id)) return "";
  pending_ += tokenizer_->TokenBytes(id);
  return TakeComplete(/*final=*/false);
}

std::string IncrementalDecoder::Flush() { return TakeComplete(/*final=*/true); }

std::string IncrementalDecoder::TakeComplete(bool final) {
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const utf8::Decoded d = utf8::DecodeAt(pending_, pos);
    if (d.kind == utf8::Decoded::Kind::kIncomplete && !final) break;  // wait for more bytes
    if (d.kind == utf8::Decoded::Kind::kValid) {
      out.append(pending_, pos, d.length);
    } else {
      utf8::Append(utf8::kReplacement, out);
    }
    pos += d.length;
  }
  pending_.erase(0, pos);
  return out;
}

}  // namespace pdserve
