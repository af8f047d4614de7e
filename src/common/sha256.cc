#include "common/sha256.h"

#include <algorithm>
#include <bit>

#include "common/check.h"

namespace pdserve {
namespace {

// FIPS 180-4 §4.2.2: the first 32 bits of the fractional parts of the cube roots of the
// first 64 primes.
constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// FIPS 180-4 §5.3.3: the first 32 bits of the fractional parts of the square roots of the
// first 8 primes.
constexpr std::array<uint32_t, 8> kInitialState = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

constexpr size_t kBlockBytes = 64;

uint32_t LoadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

Sha256::Sha256() : state_(kInitialState) {}

void Sha256::Compress(const uint8_t* block) {
  // FIPS 180-4 §6.2.2, with the message schedule computed in place.
  std::array<uint32_t, 64> w;
  for (int t = 0; t < 16; ++t) w[t] = LoadBigEndian32(block + 4 * t);
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = std::rotr(w[t - 15], 7) ^ std::rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = std::rotr(w[t - 2], 17) ^ std::rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t big_s1 = std::rotr(e, 6) ^ std::rotr(e, 11) ^ std::rotr(e, 25);
    const uint32_t choose = (e & f) ^ (~e & g);
    const uint32_t t1 = h + big_s1 + choose + kRoundConstants[t] + w[t];
    const uint32_t big_s0 = std::rotr(a, 2) ^ std::rotr(a, 13) ^ std::rotr(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = big_s0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::Update(std::span<const uint8_t> data) {
  PD_CHECK_MSG(!finished_, "Sha256::Update after Finish");
  total_bytes_ += data.size();
  size_t pos = 0;
  if (buffered_ > 0) {
    const size_t take = std::min(kBlockBytes - buffered_, data.size());
    std::copy_n(data.data(), take, buffer_.data() + buffered_);
    buffered_ += take;
    pos = take;
    if (buffered_ < kBlockBytes) return;
    Compress(buffer_.data());
    buffered_ = 0;
  }
  for (; pos + kBlockBytes <= data.size(); pos += kBlockBytes) Compress(data.data() + pos);
  std::copy(data.begin() + static_cast<std::ptrdiff_t>(pos), data.end(), buffer_.data());
  buffered_ = data.size() - pos;
}

void Sha256::Update(std::string_view data) {
  Update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
}

Sha256Digest Sha256::Finish() {
  PD_CHECK_MSG(!finished_, "Sha256::Finish called twice");
  // §5.1.1 padding: a 1 bit, zeros up to 56 mod 64, then the bit length as 64-bit big-endian.
  const uint64_t bit_length = total_bytes_ * 8;
  std::array<uint8_t, kBlockBytes + 8> pad{};
  pad[0] = 0x80;
  const size_t zeros_end = buffered_ < 56 ? 56 - buffered_ : 120 - buffered_;
  for (int i = 0; i < 8; ++i) {
    pad[zeros_end + i] = static_cast<uint8_t>(bit_length >> (56 - 8 * i));
  }
  Update(std::span<const uint8_t>(pad.data(), zeros_end + 8));
  finished_ = true;
  Sha256Digest digest;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) digest[4 * i + j] = static_cast<uint8_t>(state_[i] >> (24 - 8 * j));
  }
  return digest;
}

Sha256Digest Sha256Hash(std::string_view data) {
  Sha256 h;
  h.Update(data);
  return h.Finish();
}

Sha256Digest HmacSha256(std::string_view key, std::string_view message) {
  // RFC 2104 §2: H((K ^ opad) || H((K ^ ipad) || message)), K zero-padded to the block size.
  std::array<uint8_t, kBlockBytes> padded_key{};
  if (key.size() > kBlockBytes) {
    const Sha256Digest hashed = Sha256Hash(key);
    std::copy(hashed.begin(), hashed.end(), padded_key.begin());
  } else {
    std::copy(key.begin(), key.end(), padded_key.begin());
  }
  std::array<uint8_t, kBlockBytes> inner_pad, outer_pad;
  for (size_t i = 0; i < kBlockBytes; ++i) {
    inner_pad[i] = padded_key[i] ^ 0x36;
    outer_pad[i] = padded_key[i] ^ 0x5c;
  }
  Sha256 inner;
  inner.Update(inner_pad);
  inner.Update(message);
  const Sha256Digest inner_digest = inner.Finish();
  Sha256 outer;
  outer.Update(outer_pad);
  outer.Update(inner_digest);
  return outer.Finish();
}

bool ConstantTimeEqual(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  // Accumulate every difference; no early exit. volatile keeps the compiler from turning the
  // loop back into a short-circuiting compare.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | (a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace pdserve
