// The KV messenger's control messages (DESIGN.md §3) and their binary encoding.
//
// Every message is a 20-byte header — magic "PDKV", protocol version (u16), type (u16), body
// length (u32), transfer id (u64; 0 for types that concern no transfer) — then its body. All
// integers are little-endian with explicit sizes; strings and lists carry a u32 length.
// DecodeMessage refuses, with a ProtocolError naming the problem, anything that is not exactly
// one well-formed message of this version: short, long, corrupt lengths, counts over the caps,
// unknown types or values out of range. It never aborts and never allocates more than the
// input's size suggests.
//
// Handshake (mutual challenge-response, see cluster_proof.h), D the initiator:
//   D→P Hello{incarnation, nonce, reply_address}  (D's fabric address, so P can answer)
//   P→D HelloAck{incarnation, nonce, hello_nonce, proof, P's NodeInfo}
//                                                           D checks the proof and layouts
//   D→P HelloFinish{proof, D's NodeInfo}                    P checks the proof and layouts
// or HandshakeRefused{reason} from either side. D's memory keys (which let a writer into D's
// memory) are sent only after P has proven the secret; P's memory is never a write target.
//
// Plain value types and pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"
#include "kv/layout.h"
#include "kv/transfer_plan.h"
#include "messenger/cluster_proof.h"

namespace pdserve::messenger {

// 2: HelloAck names the Hello it answers (hello_nonce).
// 3: a layout carries its kind (GQA K and V, or an MLA latent).
// 4: PrefillRequest::cached_pages (D's prefix-cache hit: only the pages after it are written).
// 5: LoadReport carries the prefill node's measured prefill rate.
// 6: the context buffer is the context slot of the destination page holding position n - 2
//    (was the first page's), so that a cached first page may be shared under MTP.
inline constexpr uint16_t kProtocolVersion = 6;
inline constexpr size_t kHeaderBytes = 20;
// Caps: far above real use, low enough that a hostile peer cannot make us allocate much.
inline constexpr size_t kMaxMessageBytes = size_t{16} << 20;
inline constexpr uint32_t kMaxPromptTokens = uint32_t{1} << 21;
inline constexpr uint32_t kMaxRequestPages = uint32_t{1} << 21;
inline constexpr size_t kMaxTextBytes = 4096;  // names, fingerprints, reasons
inline constexpr size_t kMaxDescriptorBytes = size_t{1} << 16;
// LoadReport's rate, in thousandths of a token per second: at most 10^9 tokens/s.
inline constexpr uint64_t kMaxPrefillRateMilli = uint64_t{1'000'000'000'000};

enum class MessageType : uint16_t {
  kHello = 1,
  kHelloAck = 2,
  kHelloFinish = 3,
  kHandshakeRefused = 4,
  kPrefillRequest = 5,
  kCancel = 6,
  kCancelAck = 7,
  kWriteFailed = 8,
  kHeartbeat = 9,
  kLoadReport = 10,
};
std::string_view MessageTypeName(MessageType type);

// What a node tells its peer about itself in the handshake.
struct NodeInfo {
  std::string kernel_path;        // e.g. "avx2"; both sides must compute the same bits
  std::string model_fingerprint;  // ModelIdentity::Serialize() (common/model_identity.h)
  KvSideLayout kv;                // its shards and each rank's cache layout
  // Opaque memory descriptor of each rank's cache region (fabric::MemoryDescriptor bytes),
  // one per rank, in rank order.
  std::vector<std::string> rank_memory;
  friend bool operator==(const NodeInfo&, const NodeInfo&) = default;
};

struct Hello {
  uint64_t incarnation = 0;
  Nonce nonce{};
  // The sender's transfer-engine address (fabric::TransferEngineAddress bytes): a message from a
  // peer not yet added carries only its instance id, and P must add D to answer.
  std::string reply_address;
  friend bool operator==(const Hello&, const Hello&) = default;
};

struct HelloAck {
  uint64_t incarnation = 0;
  Nonce nonce{};
  // The nonce of the Hello this answers. D sends a new Hello (new nonce) when one goes
  // unanswered for its handshake timeout; a slow P's late answer to the old one is then told
  // apart from a failed proof and ignored. Not trusted on its own: the proof covers D's nonce.
  Nonce hello_nonce{};
  ClusterProof proof{};
  NodeInfo node;
  friend bool operator==(const HelloAck&, const HelloAck&) = default;
};

struct HelloFinish {
  ClusterProof proof{};
  NodeInfo node;
  friend bool operator==(const HelloFinish&, const HelloFinish&) = default;
};

struct HandshakeRefused {
  std::string reason;
  friend bool operator==(const HandshakeRefused&, const HandshakeRefused&) = default;
};

// D→P: prefill tokens [0, n-1) of a prompt into D's pages (DESIGN.md §3.2).
struct PrefillRequest {
  uint64_t transfer_id = 0;
  std::vector<int32_t> token_ids;
  // D already holds the KV of the prompt's first `cached_pages` pages (its prefix cache): P
  // writes only pages cached_pages, cached_pages + 1, ... of [0, n-1), to destination_pages
  // in that order (so cached_pages + destination_pages.size() pages cover the tokens). P still
  // needs the whole prefix to attend to; it computes what its own cache lacks.
  uint32_t cached_pages = 0;
  std::vector<PageId> destination_pages;
  uint32_t transfer_slot = 0;  // with generation: the writes' immediate (immediate.h)
  uint32_t generation = 0;
  // Relative, not absolute: the two hosts' clocks are not comparable. At least 1.
  uint32_t deadline_ms = 0;
  uint64_t replica_seed = 0;  // TransferPlan's replica choice
  // Where to write the last prefilled position's context (a drafter's starting hidden state),
  // if wanted: EncodeContextBuffer's bytes. P's one write of it carries the transfer's
  // immediate and counts among the writes D expects.
  std::optional<std::string> context_buffer;
  friend bool operator==(const PrefillRequest&, const PrefillRequest&) = default;
};

struct Cancel {
  uint64_t transfer_id = 0;
  friend bool operator==(const Cancel&, const Cancel&) = default;
};

// P→D: none of the request's writes can still land.
struct CancelAck {
  uint64_t transfer_id = 0;
  friend bool operator==(const CancelAck&, const CancelAck&) = default;
};

// P→D: a write of the request failed to post; D need not wait for its deadline.
struct WriteFailed {
  uint64_t transfer_id = 0;
  std::string reason;
  friend bool operator==(const WriteFailed&, const WriteFailed&) = default;
};

struct Heartbeat {
  uint64_t sequence = 0;
  friend bool operator==(const Heartbeat&, const Heartbeat&) = default;
};

// P→D: how busy this prefill node is, for D's choice of prefill node and its admission
// (docs/messenger.md, "Admission"). Sent in answer to each heartbeat, on the handshake's end
// and whenever one of its prefills ends.
struct LoadReport {
  uint64_t outstanding_prefill_tokens = 0;
  // Its measured prefill rate (messenger/admission.h's PrefillRateMeter), in thousandths of a
  // prompt token per second of busy time; 0: nothing measured yet. At most
  // kMaxPrefillRateMilli.
  uint64_t prefill_rate_milli = 0;
  friend bool operator==(const LoadReport&, const LoadReport&) = default;
};

using Message = std::variant<Hello, HelloAck, HelloFinish, HandshakeRefused, PrefillRequest, Cancel,
                             CancelAck, WriteFailed, Heartbeat, LoadReport>;

MessageType TypeOf(const Message& message);

// InvalidArgument if the message breaks a cap or a range DecodeMessage would refuse, so every
// encoded message decodes.
Result<std::string> EncodeMessage(const Message& message);

// PrefillRequest::context_buffer: `bytes` at `offset` of the decode node's rank-0 region (its
// KvCache::ContextSlot of the request's last destination page, the one holding position n-2).
struct ContextBuffer {
  uint64_t offset = 0;
  uint32_t bytes = 0;
  friend bool operator==(const ContextBuffer&, const ContextBuffer&) = default;
};
std::string EncodeContextBuffer(const ContextBuffer& buffer);
// ProtocolError unless exactly a u64 offset and a positive u32 length.
Result<ContextBuffer> ParseContextBuffer(std::string_view bytes);
Result<Message> DecodeMessage(std::string_view bytes);

}  // namespace pdserve::messenger
