#include "tokenizer/sentencepiece.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/utf8.h"

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

// Protobuf wire format, just enough to read a few scalar fields of the serialized model (the
// library's headers do not expose its proto classes).
class WireReader {
 public:
  explicit WireReader(std::string_view data) : data_(data) {}
  bool done() const { return data_.empty(); }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && !data_.empty(); shift += 7) {
      const auto byte = static_cast<uint8_t>(data_.front());
      data_.remove_prefix(1);
      *v |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  bool Key(uint64_t* field, uint64_t* wire) {
    uint64_t key;
    if (!Varint(&key)) return false;
    *field = key >> 3;
    *wire = key & 7;
    return true;
  }
  bool Bytes(std::string_view* out) {
    uint64_t n;
    if (!Varint(&n) || n > data_.size()) return false;
    *out = data_.substr(0, n);
    data_.remove_prefix(n);
    return true;
  }
  // Skips a value of wire type `wire`.
  bool Skip(uint64_t wire) {
    uint64_t v;
    std::string_view s;
    switch (wire) {
      case 0:
        return Varint(&v);
      case 2:
        return Bytes(&s);
      case 1:
        return Advance(8);
      case 5:
        return Advance(4);
      default:
        return false;
    }
  }

 private:
  bool Advance(size_t n) {
    if (n > data_.size()) return false;
    data_.remove_prefix(n);
    return true;
  }
  std::string_view data_;
};

// Whether every piece the model emits covers its own text only, whitespace aside: no
// normalization rules (NormalizerSpec.name "identity"; remove_extra_whitespaces only collapses
// spaces) and unknown characters as byte pieces (TrainerSpec.byte_fallback, field 35) rather
// than one unknown piece per run. False when the proto does not parse.
bool PiecesCoverTheirOwnText(std::string_view model_proto) {
  std::string name;
  bool byte_fallback = false;
  WireReader model(model_proto);
  uint64_t field, wire;
  while (!model.done()) {
    if (!model.Key(&field, &wire)) return false;
    if ((field != 2 && field != 3) || wire != 2) {
      if (!model.Skip(wire)) return false;
      continue;
    }
    std::string_view spec;
    if (!model.Bytes(&spec)) return false;
    for (WireReader r(spec); !r.done();) {
      uint64_t f, w, v;
      std::string_view s;
      if (!r.Key(&f, &w)) return false;
      if (field == 3 && f == 1 && w == 2) {
        if (!r.Bytes(&s)) return false;
        name = s;
      } else if (field == 2 && f == 35 && w == 0) {
        if (!r.Varint(&v)) return false;
        byte_fallback = v != 0;
      } else if (!r.Skip(w)) {
        return false;
      }
    }
  }
  return name == "identity" && byte_fallback;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  Status Init(const std::string& path);

  std::vector<int32_t> Encode(std::string_view text, bool add_special) const override;
  std::string Decode(std::span<const int32_t> ids, bool skip_special) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;

 private:
  void EncodePlain(std::string_view text, std::vector<int32_t>& ids) const;

  sentencepiece::SentencePieceProcessor sp_;
  // Control and unknown pieces ("<s>", "</s>", "<unk>") written in the text.
  AddedTokenMatcher special_matcher_;
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
  std::vector<AddedTokenMatcher::Token> specials;
  for (int id = 0; id < n; ++id) {
    const std::string& piece = sp_.IdToPiece(id);
    if (sp_.IsByte(id) && piece.size() == 6) {  // "<0xAB>"
      token_bytes_[id] =
          std::string(1, static_cast<char>(std::strtoul(piece.substr(3, 2).c_str(), nullptr, 16)));
    } else if (sp_.IsControl(id) || sp_.IsUnknown(id)) {
      token_bytes_[id] = piece;
      special_[id] = 1;
      specials.push_back({piece, id});
    } else {
      token_bytes_[id] = PieceToText(piece);
    }
  }
  special_matcher_ = AddedTokenMatcher(std::move(specials));
  if (PiecesCoverTheirOwnText(sp_.serialized_model_proto())) {
    size_t longest = 1;
    for (const std::string& bytes : token_bytes_) longest = std::max(longest, bytes.size());
    max_text_bytes_per_token_ = longest;
  }
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
  special_matcher_.Encode(
      text, [this](std::string_view plain, std::vector<int32_t>& out) { EncodePlain(plain, out); },
      ids);
  return add_special ? WithSpecials(std::move(ids)) : ids;
}

std::string SentencePieceTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out = Tokenizer::Decode(ids, skip_special);
  // Like SentencePiece's own decoder: the space that add_dummy_prefix put before the text
  // is dropped, when the text starts with an ordinary piece.
  auto first = std::find_if(ids.begin(), ids.end(), [&](int32_t id) {
    return InRange(id) && !(skip_special && special_[id] != 0);
  });
  if (dummy_prefix_ && first != ids.end() && special_[*first] == 0 && out.starts_with(' ')) {
    out.erase(0, 1);
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
