#include "model/tokenizer_sentencepiece.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "model/tokenizer_utf8.h"

namespace pdserve {
namespace {

// SentencePiece writes a space as U+2581 LOWER ONE EIGHTH BLOCK.
constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";

std::string PieceToText(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos).starts_with(kSpaceSymbol)) {
      out.push_back(' ');
      pos += kSpaceSymbol.size();
    } else {
      out.push_back(piece[pos++]);
    }
  }
  return out;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  Status Init(const std::string& path);

  std::vector<int32_t> Encode(std::string_view text, bool add_special) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special) const override;
  std::string TokenBytes(int32_t id) const override {
    return InRange(id) ? token_bytes_[id] : std::string();
  }
  bool IsSpecial(int32_t id) const override { return InRange(id) && special_[id] != 0; }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }

 private:
  bool InRange(int32_t id) const { return id >= 0 && id < vocab_size(); }
  void EncodePlain(std::string_view text, std::vector<int32_t>& ids) const;

  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> special_;
  // Control and unknown pieces ("<s>", "</s>", "<unk>") written in the text, longest first.
  std::vector<std::pair<std::string, int32_t>> special_pieces_;
  // Whether the model prepends a space to the text (add_dummy_prefix); Decode then drops
  // the space the first piece starts with, as SentencePiece's own decoder does.
  bool dummy_prefix_ = false;
};

Status SentencePieceTokenizer::Init(const std::string& path) {
  const auto status = sp_.Load(path);
  if (!status.ok()) {
    return Status::InvalidArgument(path +
                                   ": not a valid SentencePiece model: " + status.ToString());
  }
  const int n = sp_.GetPieceSize();
  if (n <= 0) return Status::InvalidArgument(path + ": SentencePiece model has no pieces");
  token_bytes_.resize(n);
  special_.assign(n, 0);
  for (int id = 0; id < n; ++id) {
    const std::string& piece = sp_.IdToPiece(id);
    if (sp_.IsByte(id) && piece.size() == 6) {  // "<0xAB>"
      token_bytes_[id] =
          std::string(1, static_cast<char>(std::strtoul(piece.substr(3, 2).c_str(), nullptr, 16)));
    } else if (sp_.IsControl(id) || sp_.IsUnknown(id)) {
      token_bytes_[id] = piece;
      special_[id] = 1;
      if (!piece.empty()) special_pieces_.emplace_back(piece, id);
    } else {
      token_bytes_[id] = PieceToText(piece);
    }
  }
  std::sort(special_pieces_.begin(), special_pieces_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (sp_.bos_id() >= 0) bos_id_ = sp_.bos_id();
  if (sp_.eos_id() >= 0) eos_ids_ = {sp_.eos_id()};
  add_bos_ = bos_id_.has_value();
  // Probe once: with a dummy prefix, the first piece of "a" starts with the space symbol.
  std::vector<int> probe;
  dummy_prefix_ = sp_.Encode("a", &probe).ok() && !probe.empty() &&
                  std::string_view(sp_.IdToPiece(probe[0])).starts_with(kSpaceSymbol);
  return Status::Ok();
}

void SentencePieceTokenizer::EncodePlain(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  // SentencePiece expects UTF-8; ill-formed bytes become U+FFFD first.
  const std::string clean = utf8::IsValid(text) ? std::string(text) : utf8::Sanitize(text);
  std::vector<int> out;
  if (!sp_.Encode(clean, &out).ok()) return;
  ids.insert(ids.end(), out.begin(), out.end());
}

std::vector<int32_t> SentencePieceTokenizer::Encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  size_t segment_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    auto match = std::find_if(special_pieces_.begin(), special_pieces_.end(),
                              [&](const auto& p) { return text.substr(pos).starts_with(p.first); });
    if (match == special_pieces_.end()) {
      ++pos;
      continue;
    }
    EncodePlain(text.substr(segment_start, pos - segment_start), ids);
    ids.push_back(match->second);
    pos += match->first.size();
    segment_start = pos;
  }
  EncodePlain(text.substr(segment_start), ids);
  return add_special ? WithSpecials(std::move(ids)) : ids;
}

std::string SentencePieceTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool first_piece = true;
  for (int32_t id : ids) {
    if (!InRange(id) || (skip_special && special_[id] != 0)) continue;
    std::string_view bytes = token_bytes_[id];
    if (first_piece && special_[id] == 0 && dummy_prefix_ && out.empty() &&
        bytes.starts_with(' ')) {
      bytes.remove_prefix(1);
    }
    if (special_[id] == 0) first_piece = false;
    out += bytes;
  }
  return out;
}

std::optional<int32_t> SentencePieceTokenizer::TokenToId(std::string_view token) const {
  const int id = sp_.PieceToId(token);
  // PieceToId answers unk_id for unknown pieces; only the unk piece itself maps there.
  if (id < 0 || (id == sp_.unk_id() && token != sp_.IdToPiece(id))) return std::nullopt;
  return id;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> LoadSentencePiece(const std::string& path) {
  auto tokenizer = std::make_unique<SentencePieceTokenizer>();
  PD_RETURN_IF_ERROR(tokenizer->Init(path));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace pdserve
