// `pdserve tokenize`: text -> token ids as a JSON array, or with --decode ids -> text, using
// the model directory's tokenizer (the same one generate and serve use).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace pdserve::cli {
namespace {

struct TokenizeFlags {
  std::string model;
  std::string text;
  bool has_text = false;
  bool no_special = false;
  bool decode = false;
};

int PrintError(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

// Ids come as a JSON array ("[1, 2]") or separated by spaces or commas ("1 2", "1,2").
Result<std::vector<int32_t>> ParseIds(const std::string& text, int32_t vocab_size) {
  std::vector<int64_t> raw;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    const auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_array()) return Status::InvalidArgument("ids: not a valid JSON array");
    for (const auto& v : parsed) {
      if (!v.is_number_integer()) {
        return Status::InvalidArgument("ids: " + v.dump() + " is not an integer");
      }
      raw.push_back(v.get<int64_t>());
    }
  } else {
    std::string spaced = text;
    for (char& c : spaced) {
      if (c == ',') c = ' ';
    }
    std::istringstream in(spaced);
    for (std::string word; in >> word;) {
      size_t used = 0;
      int64_t id = 0;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size())
        return Status::InvalidArgument("ids: \"" + word + "\" is not an integer");
      raw.push_back(id);
    }
  }
  std::vector<int32_t> ids;
  for (int64_t id : raw) {
    if (id < 0 || id >= vocab_size) {
      return Status::InvalidArgument("id " + std::to_string(id) +
                                     " is outside the vocabulary [0, " +
                                     std::to_string(vocab_size) + ")");
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

int RunTokenize(TokenizeFlags& f) {
  auto tokenizer = Tokenizer::Load(f.model);
  if (!tokenizer.ok()) return PrintError(tokenizer.status().ToString());
  if (!f.has_text) {  // no TEXT argument: read all of stdin
    f.text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  if (f.decode) {
    auto ids = ParseIds(f.text, (*tokenizer)->vocab_size());
    if (!ids.ok()) return PrintError(ids.status().ToString());
    const std::string text = (*tokenizer)->Decode(*ids, /*skip_special=*/f.no_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  const std::vector<int32_t> ids = (*tokenizer)->Encode(f.text, /*add_special=*/!f.no_special);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

void AddTokenizeCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<TokenizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Print the token ids of TEXT as a JSON array (--decode: ids to text)");
  cmd->add_option("--model", flags->model, "Model directory (tokenizer.json or tokenizer.model)")
      ->required();
  cmd->add_flag("--no-special", flags->no_special,
                "Encode: add no BOS/EOS. Decode: drop special tokens");
  cmd->add_flag("--decode", flags->decode,
                "TEXT is token ids (JSON array, or separated by spaces/commas); print the text");
  cmd->add_option("text", flags->text, "Text to tokenize (default: read stdin)");
  cmd->callback([flags, cmd, exit_code] {
    flags->has_text = cmd->count("text") > 0;
    *exit_code = RunTokenize(*flags);
  });
}

}  // namespace pdserve::cli
