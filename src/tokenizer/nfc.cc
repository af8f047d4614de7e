#include "tokenizer/nfc.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/utf8.h"

namespace pdserve::nfc {
namespace {

struct CombiningClassRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;
  bool composes;
};
struct CodePointRange {
  char32_t first, last;
};

#include "tokenizer/nfc_data.inc"

// Hangul syllables compose and decompose arithmetically (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount;
constexpr char32_t kSCount = kLCount * kNCount;

uint64_t CompositionKey(char32_t a, char32_t b) { return (static_cast<uint64_t>(a) << 32) | b; }

// Lookup maps built once from the generated arrays.
struct Maps {
  std::unordered_map<char32_t, std::pair<char32_t, char32_t>> decompose;
  std::unordered_map<uint64_t, char32_t> compose;
  Maps() {
    for (const Decomposition& d : kDecompositions) {
      decompose.emplace(d.cp, std::make_pair(d.first, d.second));
      if (d.composes) compose.emplace(CompositionKey(d.first, d.second), d.cp);
    }
  }
};

const Maps& GetMaps() {
  static const Maps maps;
  return maps;
}

uint8_t CombiningClass(char32_t cp) {
  if (cp < kCombiningClasses[0].first) return 0;
  auto it = std::upper_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), cp,
                             [](char32_t v, const CombiningClassRange& r) { return v < r.first; });
  if (it == std::begin(kCombiningClasses)) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

bool IsQuickSafe(char32_t cp) {
  if (cp < kNotQuickNfc[0].first) return true;
  auto it = std::upper_bound(std::begin(kNotQuickNfc), std::end(kNotQuickNfc), cp,
                             [](char32_t v, const CodePointRange& r) { return v < r.first; });
  --it;  // safe: cp >= the first range's start
  return cp > it->last;
}

void Decompose(char32_t cp, const Maps& maps, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = maps.decompose.find(cp);
  if (it == maps.decompose.end()) {
    out.push_back(cp);
    return;
  }
  Decompose(it->second.first, maps, out);  // mappings nest at most a few levels
  if (it->second.second != 0) Decompose(it->second.second, maps, out);
}

// Stable-sorts each run of non-starters by combining class (canonical ordering).
void ReorderMarks(std::vector<char32_t>& cps) {
  size_t i = 0;
  while (i < cps.size()) {
    if (CombiningClass(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && CombiningClass(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + i, cps.begin() + j,
                     [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
}

std::optional<char32_t> ComposePair(char32_t a, char32_t b, const Maps& maps) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  auto it = maps.compose.find(CompositionKey(a, b));
  if (it == maps.compose.end()) return std::nullopt;
  return it->second;
}

// Canonical composition: each character joins the last starter unless something between
// them blocks it (a starter, or a mark of the same or higher class).
std::vector<char32_t> Compose(const std::vector<char32_t>& cps, const Maps& maps) {
  std::vector<char32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  uint8_t last_ccc = 0;
  for (char32_t cp : cps) {
    const uint8_t ccc = CombiningClass(cp);
    if (starter != SIZE_MAX) {
      const bool adjacent = starter + 1 == out.size();
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        if (std::optional<char32_t> composed = ComposePair(out[starter], cp, maps)) {
          out[starter] = *composed;
          continue;
        }
      }
    }
    if (ccc == 0) starter = out.size();
    last_ccc = ccc;
    out.push_back(cp);
  }
  return out;
}

}  // namespace

bool IsQuickNfc(std::string_view valid_utf8) {
  for (size_t pos = 0; pos < valid_utf8.size();) {
    const auto b = static_cast<unsigned char>(valid_utf8[pos]);
    if (b < 0x80) {
      ++pos;
      continue;
    }
    const utf8::Decoded d = utf8::DecodeAt(valid_utf8, pos);
    if (d.kind != utf8::Decoded::Kind::kValid || !IsQuickSafe(d.cp)) return false;
    pos += d.length;
  }
  return true;
}

std::string Normalize(std::string_view valid_utf8) {
  const Maps& maps = GetMaps();
  std::vector<char32_t> cps;
  cps.reserve(valid_utf8.size());
  for (size_t pos = 0; pos < valid_utf8.size();) {
    const utf8::Decoded d = utf8::DecodeAt(valid_utf8, pos);
    Decompose(d.cp, maps, cps);  // invalid input decodes as U+FFFD (precondition violated)
    pos += d.length;
  }
  ReorderMarks(cps);
  std::string out;
  out.reserve(valid_utf8.size());
  for (char32_t cp : Compose(cps, maps)) utf8::Append(cp, out);
  return out;
}

}  // namespace pdserve::nfc
