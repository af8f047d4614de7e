#include "messenger/protocol.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "messenger/immediate.h"

namespace pdserve::messenger {
namespace {

NodeInfo SampleNode(int kv_heads, int tp) {
  auto shards = KvShardLayout::ForTensorParallel(kv_heads, tp);
  EXPECT_TRUE(shards.ok());
  NodeInfo n{.kernel_path = "avx2",
             .model_fingerprint = "sha256:0123456789abcdef",
             .kv = {.shards = *shards, .ranks = {}},
             .rank_memory = {}};
  for (int r = 0; r < tp; ++r) {
    n.kv.ranks.push_back(KvLayout{.num_layers = 28,
                                  .num_kv_heads = shards->heads(r).size(),
                                  .head_dim = 128,
                                  .page_tokens = 16,
                                  .dtype = r % 2 ? DType::kF32 : DType::kBF16,
                                  .num_pages = 1000 + r,
                                  .kind = r == 1 ? KvKind::kLatent : KvKind::kGqa});
    n.rank_memory.push_back(std::string("\x00\x01key", 5) + std::to_string(r));
  }
  return n;
}

Nonce FilledNonce(uint8_t first) {
  Nonce n;
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(first + 3 * i);
  return n;
}

PrefillRequest SampleRequest() {
  return PrefillRequest{.transfer_id = 0x0102030405060708,
                        .token_ids = {100000, 200000, 7, 0, 151643},
                        .cached_pages = 2,
                        .destination_pages = {900000, 3, 2},
                        .transfer_slot = kMaxTransferSlots - 1,
                        .generation = 17,
                        .deadline_ms = 30000,
                        .replica_seed = 0xdeadbeefcafef00d,
                        .context_buffer = std::string("ctx-descriptor")};
}

std::vector<Message> SampleMessages() {
  PrefillRequest no_context = SampleRequest();
  no_context.context_buffer.reset();
  no_context.transfer_id = 9;
  ClusterProof proof;
  for (size_t i = 0; i < proof.size(); ++i) proof[i] = static_cast<uint8_t>(255 - i);
  return {
      Hello{.incarnation = 0xfedcba9876543210, .nonce = FilledNonce(1), .reply_address = "addr"},
      HelloAck{.incarnation = 42,
               .nonce = FilledNonce(9),
               .hello_nonce = FilledNonce(1),
               .proof = proof,
               .node = SampleNode(2, 4)},
      HelloFinish{.proof = proof, .node = SampleNode(8, 2)},
      HandshakeRefused{.reason = "model fingerprint differs"},
      SampleRequest(),
      no_context,
      Cancel{.transfer_id = 77},
      CancelAck{.transfer_id = 78},
      WriteFailed{.transfer_id = 79, .reason = "fi_writedata: -FI_EIO"},
      Heartbeat{.sequence = 12345},
      LoadReport{.outstanding_prefill_tokens = 1u << 30, .prefill_rate_milli = 123456789},
  };
}

std::string Encode(const Message& m) {
  auto bytes = EncodeMessage(m);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return bytes.ok() ? *bytes : std::string();
}

void PatchU32(std::string* bytes, size_t offset, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*bytes)[offset + i] = static_cast<char>(v >> (8 * i));
}

uint32_t ReadU32(const std::string& bytes, size_t offset) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(bytes[offset + i])} << (8 * i);
  return v;
}

void ExpectRefused(const std::string& bytes, const std::string& what) {
  auto decoded = DecodeMessage(bytes);
  ASSERT_FALSE(decoded.ok()) << what;
  EXPECT_EQ(decoded.status().code(), StatusCode::kProtocolError) << what;
  EXPECT_FALSE(decoded.status().message().empty());
}

TEST(ProtocolTest, EveryMessageRoundTrips) {
  std::set<MessageType> types;
  for (const Message& m : SampleMessages()) {
    SCOPED_TRACE(std::string(MessageTypeName(TypeOf(m))));
    const std::string bytes = Encode(m);
    ASSERT_GE(bytes.size(), kHeaderBytes);
    EXPECT_EQ(bytes.substr(0, 4), "PDKV");
    EXPECT_EQ(ReadU32(bytes, 8), bytes.size() - kHeaderBytes);  // the body length field
    auto decoded = DecodeMessage(bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, m);
    types.insert(TypeOf(*decoded));
  }
  EXPECT_EQ(types.size(), std::variant_size_v<Message>);  // every type was covered
}

TEST(ProtocolTest, EncodingIsExplicitLittleEndian) {
  const std::string bytes = Encode(Heartbeat{.sequence = 0x0807060504030201});
  const std::string expected_body("\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  ASSERT_EQ(bytes.size(), kHeaderBytes + 8);
  EXPECT_EQ(bytes.substr(kHeaderBytes), expected_body);
  EXPECT_EQ(bytes.substr(4, 2), std::string("\x06\x00", 2));  // version 6
  EXPECT_EQ(bytes.substr(6, 2), std::string("\x09\x00", 2));  // type Heartbeat
}

// The fuzzer starts from these seeds; one the decoder refuses (say, of an older protocol
// version) would only ever exercise the header checks.
TEST(ProtocolTest, FuzzSeedsAreMessagesOfThisVersion) {
  std::set<MessageType> types;
  for (const auto& entry : std::filesystem::directory_iterator(PDSERVE_PROTOCOL_CORPUS_DIR)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Result<Message> m = DecodeMessage(bytes);
    EXPECT_TRUE(m.ok()) << entry.path() << ": " << m.status().ToString();
    if (!m.ok()) continue;
    types.insert(TypeOf(*m));
  }
  EXPECT_EQ(types.size(), std::variant_size_v<Message>) << "a message type has no seed";
}

TEST(ProtocolTest, EveryTruncationIsRefused) {
  for (const Message& m : SampleMessages()) {
    const std::string bytes = Encode(m);
    for (size_t len = 0; len < bytes.size(); ++len) {
      const std::string what =
          std::string(MessageTypeName(TypeOf(m))) + " cut to " + std::to_string(len);
      std::string cut = bytes.substr(0, len);
      ExpectRefused(cut, what);
      // With a length field that agrees, the body decoder itself must notice the cut.
      if (len < kHeaderBytes) continue;
      PatchU32(&cut, 8, static_cast<uint32_t>(len - kHeaderBytes));
      ExpectRefused(cut, what + " (length field patched)");
    }
  }
}

TEST(ProtocolTest, TrailingBytesAreRefused) {
  for (const Message& m : SampleMessages()) {
    std::string bytes = Encode(m) + "x";
    ExpectRefused(bytes, "unannounced trailing byte");
    PatchU32(&bytes, 8, ReadU32(bytes, 8) + 1);  // the length field now covers it
    ExpectRefused(bytes, "announced trailing byte");
  }
}

TEST(ProtocolTest, CorruptLengthFieldsAreRefused) {
  for (const Message& m : SampleMessages()) {
    const std::string good = Encode(m);
    const uint32_t body = ReadU32(good, 8);
    for (uint32_t bad : {body + 1, body - 1, 0u, 0xffffffffu}) {
      if (bad == body) continue;
      std::string bytes = good;
      PatchU32(&bytes, 8, bad);
      ExpectRefused(bytes, "body length " + std::to_string(bad));
    }
  }
  // Counts and string lengths inside bodies: one past the data, the cap plus one, all ones.
  const PrefillRequest request = SampleRequest();
  const std::string prefill = Encode(request);
  const size_t token_count_at = kHeaderBytes;
  const size_t page_count_at = token_count_at + 4 + 4 * request.token_ids.size() + 4;
  const HelloAck ack = std::get<HelloAck>(SampleMessages()[1]);
  const std::string hello_ack = Encode(ack);
  // incarnation, nonce, hello nonce, proof
  const size_t kernel_path_at = kHeaderBytes + 8 + 2 * kNonceBytes + 32;
  const size_t fingerprint_at = kernel_path_at + 4 + ack.node.kernel_path.size();
  const size_t rank_count_at = fingerprint_at + 4 + ack.node.model_fingerprint.size() + 4;
  ASSERT_EQ(ReadU32(hello_ack, rank_count_at), 4u);
  const struct {
    const std::string* message;
    size_t offset;
    uint32_t cap;
  } fields[] = {{&prefill, token_count_at, kMaxPromptTokens},
                {&prefill, page_count_at, kMaxRequestPages},
                {&hello_ack, kernel_path_at, kMaxTextBytes},
                {&hello_ack, fingerprint_at, kMaxTextBytes},
                {&hello_ack, rank_count_at, KvShardLayout::kMaxRanks}};
  for (const auto& f : fields) {
    const uint32_t value = ReadU32(*f.message, f.offset);
    for (uint32_t bad : {value + 1, f.cap + 1, 0xffffffffu}) {
      std::string bytes = *f.message;
      PatchU32(&bytes, f.offset, bad);
      ExpectRefused(bytes,
                    "field at " + std::to_string(f.offset) + " set to " + std::to_string(bad));
    }
  }
}

TEST(ProtocolTest, VersionMismatchNamesBothVersions) {
  std::string bytes = Encode(Cancel{.transfer_id = 5});
  bytes[4] = 7;  // version 7
  auto decoded = DecodeMessage(bytes);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(decoded.status().message().find("version 7"), std::string::npos)
      << decoded.status().message();
  EXPECT_NE(decoded.status().message().find("version " + std::to_string(kProtocolVersion)),
            std::string::npos)
      << decoded.status().message();
  // Only magic and version are needed to say so: a future header layout still gets this error.
  auto short_one = DecodeMessage(bytes.substr(0, 6));
  EXPECT_NE(short_one.status().message().find("version 7"), std::string::npos);
}

TEST(ProtocolTest, BadMagicUnknownTypesAndMisplacedRequestIdsAreRefused) {
  std::string bytes = Encode(Heartbeat{.sequence = 1});
  bytes[0] = 'X';
  ExpectRefused(bytes, "bad magic");
  for (uint16_t type : {0, 11, 0xffff}) {
    bytes = Encode(Heartbeat{.sequence = 1});
    bytes[6] = static_cast<char>(type & 0xff);
    bytes[7] = static_cast<char>(type >> 8);
    ExpectRefused(bytes, "type " + std::to_string(type));
  }
  bytes = Encode(Heartbeat{.sequence = 1});
  bytes[12] = 1;  // a transfer id on a message that concerns no transfer
  ExpectRefused(bytes, "transfer id on a heartbeat");
  bytes = Encode(Cancel{.transfer_id = 1});
  bytes[12] = 0;  // transfer id 0 on a Cancel
  ExpectRefused(bytes, "Cancel without transfer id");
}

TEST(ProtocolTest, OutOfRangeValuesAreRefusedOnDecode) {
  const PrefillRequest request = SampleRequest();
  const std::string good = Encode(request);
  const size_t first_token_at = kHeaderBytes + 4;
  std::string bytes = good;
  PatchU32(&bytes, first_token_at, 0x80000000u);  // a negative token id
  ExpectRefused(bytes, "negative token");
  const size_t cached_at = first_token_at + 4 * request.token_ids.size();
  bytes = good;
  PatchU32(&bytes, cached_at, kMaxRequestPages + 1);
  ExpectRefused(bytes, "cached pages past the cap");
  const size_t slot_at = cached_at + 4 + 4 + 4 * request.destination_pages.size();
  bytes = good;
  PatchU32(&bytes, slot_at, kMaxTransferSlots);
  ExpectRefused(bytes, "slot past the immediate's 20 bits");
  bytes = good;
  PatchU32(&bytes, slot_at + 4, kTransferGenerations);
  ExpectRefused(bytes, "generation past the immediate's 12 bits");
  bytes = good;
  PatchU32(&bytes, slot_at + 8, 0);
  ExpectRefused(bytes, "no deadline");
  bytes = good;
  bytes[slot_at + 20] = 2;
  ExpectRefused(bytes, "context flag 2");

  // A prefill rate past the cap; the cap itself is taken.
  const std::string report = Encode(
      LoadReport{.outstanding_prefill_tokens = 5, .prefill_rate_milli = kMaxPrefillRateMilli});
  ASSERT_TRUE(DecodeMessage(report).ok());
  bytes = report;
  PatchU32(&bytes, kHeaderBytes + 8, static_cast<uint32_t>(kMaxPrefillRateMilli + 1));
  PatchU32(&bytes, kHeaderBytes + 12, static_cast<uint32_t>((kMaxPrefillRateMilli + 1) >> 32));
  ExpectRefused(bytes, "prefill rate over the cap");
  // A version-4 report (no rate) is 8 bytes short of a version-5 one.
  bytes = report.substr(0, report.size() - 8);
  PatchU32(&bytes, 8, 8);
  ExpectRefused(bytes, "report without its rate");

  // A node whose ranks overlap, and one with an unknown dtype.
  const HelloFinish finish{.proof = {}, .node = SampleNode(8, 2)};
  const std::string hello = Encode(finish);
  const size_t ranks_at = kHeaderBytes + 32 + 4 + finish.node.kernel_path.size() + 4 +
                          finish.node.model_fingerprint.size() + 8;
  bytes = hello;
  PatchU32(&bytes, ranks_at, 1);  // rank 0 now holds [1, 4), overlapping nobody's start
  ExpectRefused(bytes, "rank 0 heads");
  // Protocol version 1 spells a layout's dtype 0 for f32 and 1 for bf16, whatever DType's order.
  EXPECT_EQ(finish.node.kv.ranks[0].dtype, DType::kBF16);
  EXPECT_EQ(hello[ranks_at + 8 + 16], 1);
  bytes = hello;
  bytes[ranks_at + 8 + 16] = 9;  // rank 0 dtype
  ExpectRefused(bytes, "dtype 9");
  bytes = hello;
  bytes[ranks_at + 8 + 16] = 2;  // no KV dtype has code 2 (DType::kF16's value)
  ExpectRefused(bytes, "dtype 2");
  bytes = hello;
  PatchU32(&bytes, ranks_at + 8 + 8, 0);  // rank 0 head_dim 0
  ExpectRefused(bytes, "head_dim 0");
}

TEST(ProtocolTest, EncoderRefusesWhatTheDecoderWould) {
  auto refused = [](const Message& m, const char* what) {
    auto bytes = EncodeMessage(m);
    ASSERT_FALSE(bytes.ok()) << what;
    EXPECT_EQ(bytes.status().code(), StatusCode::kInvalidArgument) << what;
  };
  PrefillRequest r = SampleRequest();
  r.token_ids.clear();
  refused(r, "no tokens");
  r = SampleRequest();
  r.token_ids[1] = -5;
  refused(r, "negative token");
  r = SampleRequest();
  r.transfer_slot = kMaxTransferSlots;
  refused(r, "slot too large");
  r = SampleRequest();
  r.deadline_ms = 0;
  refused(r, "no deadline");
  r = SampleRequest();
  r.transfer_id = 0;
  refused(r, "transfer id 0");
  refused(HelloAck{}, "node info without ranks");
  NodeInfo node = SampleNode(4, 2);
  node.rank_memory.pop_back();
  refused(HelloFinish{.proof = {}, .node = node}, "descriptor missing");
  node = SampleNode(4, 2);
  node.kv.ranks[1].dtype = DType::kF16;
  refused(HelloFinish{.proof = {}, .node = node}, "f16 KV layout");
  refused(WriteFailed{.transfer_id = 1, .reason = std::string(kMaxTextBytes + 1, 'x')},
          "reason too long");
  refused(
      LoadReport{.outstanding_prefill_tokens = 0, .prefill_rate_milli = kMaxPrefillRateMilli + 1},
      "prefill rate over the cap");
  // Within every count cap but over the message cap.
  r = SampleRequest();
  r.token_ids.assign(kMaxPromptTokens, 1);
  r.destination_pages.assign(kMaxRequestPages, 1);
  refused(r, "message over 16 MiB");
}

}  // namespace
}  // namespace pdserve::messenger
