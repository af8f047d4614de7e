#include "messenger/protocol.h"

#include <type_traits>

#include <fmt/format.h>

#include "common/byte_codec.h"
#include "messenger/immediate.h"

namespace pdserve::messenger {
namespace {

constexpr uint32_t kMagic = 0x564b4450;  // "PDKV" as little-endian bytes
constexpr size_t kBodyLengthOffset = 8;
// Smallest encoding of one rank in a NodeInfo: head range, KvLayout, descriptor length.
constexpr size_t kMinRankBytes = 2 * 4 + 5 * 4 + 1 + 1 + 4;

template <typename... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
// Clang before 17 does not deduce aggregate template arguments by itself.
template <typename... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

bool CarriesTransferId(MessageType type) {
  return type == MessageType::kPrefillRequest || type == MessageType::kCancel ||
         type == MessageType::kCancelAck || type == MessageType::kWriteFailed;
}

uint64_t TransferIdOf(const Message& m) {
  return std::visit(Overloaded{[](const PrefillRequest& r) { return r.transfer_id; },
                               [](const Cancel& r) { return r.transfer_id; },
                               [](const CancelAck& r) { return r.transfer_id; },
                               [](const WriteFailed& r) { return r.transfer_id; },
                               [](const auto&) { return uint64_t{0}; }},
                    m);
}

Status Invalid(std::string message) { return Status::InvalidArgument(std::move(message)); }

Status CheckText(std::string_view field, const std::string& text) {
  if (text.size() > kMaxTextBytes) {
    return Invalid(fmt::format("{} is {} bytes (at most {})", field, text.size(), kMaxTextBytes));
  }
  return Status::Ok();
}

// --- Semantic checks shared by the encoder (before writing) and the decoder (after parsing).

Status CheckDescriptor(std::string_view field, const std::string& bytes) {
  if (bytes.size() > kMaxDescriptorBytes) {
    return Invalid(
        fmt::format("{} is {} bytes (at most {})", field, bytes.size(), kMaxDescriptorBytes));
  }
  return Status::Ok();
}

Status CheckNodeInfo(const NodeInfo& n) {
  PD_RETURN_IF_ERROR(CheckText("kernel path", n.kernel_path));
  PD_RETURN_IF_ERROR(CheckText("model fingerprint", n.model_fingerprint));
  const KvShardLayout& shards = n.kv.shards;
  // Re-validating catches a default-constructed (rankless) layout on the encoding side.
  PD_RETURN_IF_ERROR(KvShardLayout::Create(shards.total_kv_heads(), shards.rank_heads()).status());
  const size_t ranks = static_cast<size_t>(shards.tp_size());
  if (n.kv.ranks.size() != ranks || n.rank_memory.size() != ranks) {
    return Invalid(fmt::format("node info has {} shards, {} rank layouts, {} memory descriptors",
                               ranks, n.kv.ranks.size(), n.rank_memory.size()));
  }
  for (size_t r = 0; r < ranks; ++r) {
    PD_RETURN_IF_ERROR(n.kv.ranks[r].Validate().WithContext(fmt::format("rank {}", r)));
    if (n.rank_memory[r].size() > kMaxDescriptorBytes) {
      return Invalid(fmt::format("rank {} memory descriptor is {} bytes (at most {})", r,
                                 n.rank_memory[r].size(), kMaxDescriptorBytes));
    }
  }
  return Status::Ok();
}

Status CheckPrefillRequest(const PrefillRequest& p) {
  if (p.token_ids.empty() || p.token_ids.size() > kMaxPromptTokens) {
    return Invalid(
        fmt::format("prefill request has {} tokens (1..{})", p.token_ids.size(), kMaxPromptTokens));
  }
  if (p.destination_pages.empty() || p.destination_pages.size() > kMaxRequestPages) {
    return Invalid(fmt::format("prefill request has {} destination pages (1..{})",
                               p.destination_pages.size(), kMaxRequestPages));
  }
  if (p.cached_pages > kMaxRequestPages) {
    return Invalid(fmt::format("prefill request has {} cached pages (at most {})", p.cached_pages,
                               kMaxRequestPages));
  }
  for (int32_t t : p.token_ids) {
    if (t < 0) return Invalid(fmt::format("negative token id {}", t));
  }
  for (PageId page : p.destination_pages) {
    if (page < 0) return Invalid(fmt::format("negative destination page {}", page));
  }
  if (!IsValidTransferTag({.slot = p.transfer_slot, .generation = p.generation})) {
    return Invalid(fmt::format("transfer slot {} generation {} do not fit the immediate ({}, {})",
                               p.transfer_slot, p.generation, kMaxTransferSlots,
                               kTransferGenerations));
  }
  if (p.deadline_ms == 0) return Invalid("prefill request without a deadline");
  if (p.context_buffer && p.context_buffer->size() > kMaxDescriptorBytes) {
    return Invalid(fmt::format("context buffer descriptor is {} bytes (at most {})",
                               p.context_buffer->size(), kMaxDescriptorBytes));
  }
  return Status::Ok();
}

Status CheckMessage(const Message& m) {
  if (CarriesTransferId(TypeOf(m)) && TransferIdOf(m) == 0) {
    return Invalid(fmt::format("{} with transfer id 0", MessageTypeName(TypeOf(m))));
  }
  return std::visit(
      Overloaded{[](const Hello& h) { return CheckDescriptor("reply address", h.reply_address); },
                 [](const HelloAck& h) { return CheckNodeInfo(h.node); },
                 [](const HelloFinish& h) { return CheckNodeInfo(h.node); },
                 [](const HandshakeRefused& h) { return CheckText("refusal reason", h.reason); },
                 [](const PrefillRequest& p) { return CheckPrefillRequest(p); },
                 [](const WriteFailed& w) { return CheckText("write failure reason", w.reason); },
                 [](const LoadReport& l) {
                   return l.prefill_rate_milli <= kMaxPrefillRateMilli
                              ? Status::Ok()
                              : Invalid(fmt::format(
                                    "prefill rate {} thousandths of a token/s over the cap {}",
                                    l.prefill_rate_milli, kMaxPrefillRateMilli));
                 },
                 [](const auto&) { return Status::Ok(); }},
      m);
}

// --- Bodies: writers.

void WriteFixed(ByteWriter& w, std::span<const uint8_t> bytes) {
  w.Raw(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

// A layout's dtype travels as its own code, so reordering DType never changes the wire. Only KV
// element types have one: EncodeMessage validates the layout before writing it.
constexpr uint8_t kWireF32 = 0, kWireBF16 = 1;
// The same for a layout's kind.
constexpr uint8_t kWireGqa = 0, kWireLatent = 1;

void WriteLayout(ByteWriter& w, const KvLayout& l) {
  w.U32(static_cast<uint32_t>(l.num_layers));
  w.U32(static_cast<uint32_t>(l.num_kv_heads));
  w.U32(static_cast<uint32_t>(l.head_dim));
  w.U32(static_cast<uint32_t>(l.page_tokens));
  w.U8(l.dtype == DType::kF32 ? kWireF32 : kWireBF16);
  w.U32(static_cast<uint32_t>(l.num_pages));
  w.U8(l.kind == KvKind::kLatent ? kWireLatent : kWireGqa);
}

void WriteNodeInfo(ByteWriter& w, const NodeInfo& n) {
  w.Bytes(n.kernel_path);
  w.Bytes(n.model_fingerprint);
  w.U32(static_cast<uint32_t>(n.kv.shards.total_kv_heads()));
  w.U32(static_cast<uint32_t>(n.kv.shards.tp_size()));
  for (int r = 0; r < n.kv.shards.tp_size(); ++r) {
    w.U32(static_cast<uint32_t>(n.kv.shards.heads(r).begin));
    w.U32(static_cast<uint32_t>(n.kv.shards.heads(r).end));
    WriteLayout(w, n.kv.ranks[r]);
    w.Bytes(n.rank_memory[r]);
  }
}

void WriteBody(ByteWriter& w, const Message& m) {
  std::visit(Overloaded{[&](const Hello& h) {
                          w.U64(h.incarnation);
                          WriteFixed(w, h.nonce);
                          w.Bytes(h.reply_address);
                        },
                        [&](const HelloAck& h) {
                          w.U64(h.incarnation);
                          WriteFixed(w, h.nonce);
                          WriteFixed(w, h.hello_nonce);
                          WriteFixed(w, h.proof);
                          WriteNodeInfo(w, h.node);
                        },
                        [&](const HelloFinish& h) {
                          WriteFixed(w, h.proof);
                          WriteNodeInfo(w, h.node);
                        },
                        [&](const HandshakeRefused& h) { w.Bytes(h.reason); },
                        [&](const PrefillRequest& p) {
                          w.U32(static_cast<uint32_t>(p.token_ids.size()));
                          for (int32_t t : p.token_ids) w.U32(static_cast<uint32_t>(t));
                          w.U32(p.cached_pages);
                          w.U32(static_cast<uint32_t>(p.destination_pages.size()));
                          for (PageId page : p.destination_pages) {
                            w.U32(static_cast<uint32_t>(page));
                          }
                          w.U32(p.transfer_slot);
                          w.U32(p.generation);
                          w.U32(p.deadline_ms);
                          w.U64(p.replica_seed);
                          w.U8(p.context_buffer ? 1 : 0);
                          if (p.context_buffer) w.Bytes(*p.context_buffer);
                        },
                        [&](const WriteFailed& f) { w.Bytes(f.reason); },
                        [&](const Heartbeat& h) { w.U64(h.sequence); },
                        [&](const LoadReport& l) {
                          w.U64(l.outstanding_prefill_tokens);
                          w.U64(l.prefill_rate_milli);
                        },
                        [](const auto&) {}},  // Cancel, CancelAck: the header says it all
             m);
}

// --- Bodies: readers. Structure and allocation bounds only; CheckMessage does the rest.

template <size_t N>
Status ReadFixed(ByteReader& r, const char* field, std::array<uint8_t, N>* out) {
  std::string_view bytes;
  PD_RETURN_IF_ERROR(r.Raw(field, N, &bytes));
  for (size_t i = 0; i < N; ++i) (*out)[i] = static_cast<uint8_t>(bytes[i]);
  return Status::Ok();
}

Status ReadLayout(ByteReader& r, KvLayout* l) {
  PD_RETURN_IF_ERROR(r.NonNegativeI32("num_layers", &l->num_layers));
  PD_RETURN_IF_ERROR(r.NonNegativeI32("num_kv_heads", &l->num_kv_heads));
  PD_RETURN_IF_ERROR(r.NonNegativeI32("head_dim", &l->head_dim));
  PD_RETURN_IF_ERROR(r.NonNegativeI32("page_tokens", &l->page_tokens));
  uint8_t dtype = 0;
  PD_RETURN_IF_ERROR(r.U8("dtype", &dtype));
  if (dtype != kWireF32 && dtype != kWireBF16) {
    return Status::ProtocolError(fmt::format("unknown KV dtype {}", dtype));
  }
  l->dtype = dtype == kWireF32 ? DType::kF32 : DType::kBF16;
  PD_RETURN_IF_ERROR(r.NonNegativeI32("num_pages", &l->num_pages));
  uint8_t kind = 0;
  PD_RETURN_IF_ERROR(r.U8("layout kind", &kind));
  if (kind != kWireGqa && kind != kWireLatent) {
    return Status::ProtocolError(fmt::format("unknown KV layout kind {}", kind));
  }
  l->kind = kind == kWireLatent ? KvKind::kLatent : KvKind::kGqa;
  return Status::Ok();
}

Status ReadNodeInfo(ByteReader& r, NodeInfo* n) {
  PD_RETURN_IF_ERROR(r.Bytes("kernel path", kMaxTextBytes, &n->kernel_path));
  PD_RETURN_IF_ERROR(r.Bytes("model fingerprint", kMaxTextBytes, &n->model_fingerprint));
  int32_t total_heads = 0;
  uint32_t ranks = 0;
  PD_RETURN_IF_ERROR(r.NonNegativeI32("total KV heads", &total_heads));
  PD_RETURN_IF_ERROR(r.Count("rank count", KvShardLayout::kMaxRanks, kMinRankBytes, &ranks));
  std::vector<HeadRange> heads(ranks);
  n->kv.ranks.assign(ranks, KvLayout{});
  n->rank_memory.assign(ranks, std::string());
  for (uint32_t i = 0; i < ranks; ++i) {
    PD_RETURN_IF_ERROR(r.NonNegativeI32("rank first head", &heads[i].begin));
    PD_RETURN_IF_ERROR(r.NonNegativeI32("rank end head", &heads[i].end));
    PD_RETURN_IF_ERROR(ReadLayout(r, &n->kv.ranks[i]));
    PD_RETURN_IF_ERROR(r.Bytes("rank memory descriptor", kMaxDescriptorBytes, &n->rank_memory[i]));
  }
  PD_ASSIGN_OR_RETURN(n->kv.shards, KvShardLayout::Create(total_heads, std::move(heads)));
  return Status::Ok();
}

Status ReadPrefillRequest(ByteReader& r, PrefillRequest* p) {
  uint32_t count = 0;
  PD_RETURN_IF_ERROR(r.Count("token count", kMaxPromptTokens, 4, &count));
  p->token_ids.resize(count);
  for (int32_t& t : p->token_ids) PD_RETURN_IF_ERROR(r.NonNegativeI32("token id", &t));
  PD_RETURN_IF_ERROR(r.U32("cached pages", &p->cached_pages));
  if (p->cached_pages > kMaxRequestPages) {
    return Status::ProtocolError(
        fmt::format("cached pages {} (at most {})", p->cached_pages, kMaxRequestPages));
  }
  PD_RETURN_IF_ERROR(r.Count("page count", kMaxRequestPages, 4, &count));
  p->destination_pages.resize(count);
  for (PageId& page : p->destination_pages) {
    PD_RETURN_IF_ERROR(r.NonNegativeI32("destination page", &page));
  }
  PD_RETURN_IF_ERROR(r.U32("transfer slot", &p->transfer_slot));
  PD_RETURN_IF_ERROR(r.U32("generation", &p->generation));
  PD_RETURN_IF_ERROR(r.U32("deadline", &p->deadline_ms));
  PD_RETURN_IF_ERROR(r.U64("replica seed", &p->replica_seed));
  uint8_t has_context = 0;
  PD_RETURN_IF_ERROR(r.U8("context flag", &has_context));
  if (has_context > 1) {
    return Status::ProtocolError(fmt::format("context flag is {} (0 or 1)", has_context));
  }
  if (has_context == 1) {
    p->context_buffer.emplace();
    PD_RETURN_IF_ERROR(r.Bytes("context buffer", kMaxDescriptorBytes, &*p->context_buffer));
  }
  return Status::Ok();
}

Result<Message> ReadBody(ByteReader& r, MessageType type, uint64_t transfer_id) {
  switch (type) {
    case MessageType::kHello: {
      Hello h;
      PD_RETURN_IF_ERROR(r.U64("incarnation", &h.incarnation));
      PD_RETURN_IF_ERROR(ReadFixed(r, "nonce", &h.nonce));
      PD_RETURN_IF_ERROR(r.Bytes("reply address", kMaxDescriptorBytes, &h.reply_address));
      return Message(h);
    }
    case MessageType::kHelloAck: {
      HelloAck h;
      PD_RETURN_IF_ERROR(r.U64("incarnation", &h.incarnation));
      PD_RETURN_IF_ERROR(ReadFixed(r, "nonce", &h.nonce));
      PD_RETURN_IF_ERROR(ReadFixed(r, "hello nonce", &h.hello_nonce));
      PD_RETURN_IF_ERROR(ReadFixed(r, "proof", &h.proof));
      PD_RETURN_IF_ERROR(ReadNodeInfo(r, &h.node));
      return Message(std::move(h));
    }
    case MessageType::kHelloFinish: {
      HelloFinish h;
      PD_RETURN_IF_ERROR(ReadFixed(r, "proof", &h.proof));
      PD_RETURN_IF_ERROR(ReadNodeInfo(r, &h.node));
      return Message(std::move(h));
    }
    case MessageType::kHandshakeRefused: {
      HandshakeRefused h;
      PD_RETURN_IF_ERROR(r.Bytes("refusal reason", kMaxTextBytes, &h.reason));
      return Message(std::move(h));
    }
    case MessageType::kPrefillRequest: {
      PrefillRequest p;
      p.transfer_id = transfer_id;
      PD_RETURN_IF_ERROR(ReadPrefillRequest(r, &p));
      return Message(std::move(p));
    }
    case MessageType::kCancel:
      return Message(Cancel{.transfer_id = transfer_id});
    case MessageType::kCancelAck:
      return Message(CancelAck{.transfer_id = transfer_id});
    case MessageType::kWriteFailed: {
      WriteFailed f{.transfer_id = transfer_id, .reason = {}};
      PD_RETURN_IF_ERROR(r.Bytes("write failure reason", kMaxTextBytes, &f.reason));
      return Message(std::move(f));
    }
    case MessageType::kHeartbeat: {
      Heartbeat h;
      PD_RETURN_IF_ERROR(r.U64("heartbeat sequence", &h.sequence));
      return Message(h);
    }
    case MessageType::kLoadReport: {
      LoadReport l;
      PD_RETURN_IF_ERROR(r.U64("outstanding prefill tokens", &l.outstanding_prefill_tokens));
      PD_RETURN_IF_ERROR(r.U64("prefill rate", &l.prefill_rate_milli));
      return Message(l);
    }
  }
  return Status::ProtocolError(fmt::format("unknown message type {}", static_cast<int>(type)));
}

bool IsKnownType(uint16_t type) {
  return type >= static_cast<uint16_t>(MessageType::kHello) &&
         type <= static_cast<uint16_t>(MessageType::kLoadReport);
}

}  // namespace

std::string_view MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kHello:
      return "Hello";
    case MessageType::kHelloAck:
      return "HelloAck";
    case MessageType::kHelloFinish:
      return "HelloFinish";
    case MessageType::kHandshakeRefused:
      return "HandshakeRefused";
    case MessageType::kPrefillRequest:
      return "PrefillRequest";
    case MessageType::kCancel:
      return "Cancel";
    case MessageType::kCancelAck:
      return "CancelAck";
    case MessageType::kWriteFailed:
      return "WriteFailed";
    case MessageType::kHeartbeat:
      return "Heartbeat";
    case MessageType::kLoadReport:
      return "LoadReport";
  }
  return "unknown";
}

// TypeOf relies on the variant listing its alternatives in MessageType order.
static_assert(std::is_same_v<std::variant_alternative_t<0, Message>, Hello>);
static_assert(
    std::is_same_v<
        std::variant_alternative_t<static_cast<size_t>(MessageType::kPrefillRequest) - 1, Message>,
        PrefillRequest>);
static_assert(std::variant_size_v<Message> == static_cast<size_t>(MessageType::kLoadReport));
static_assert(std::is_same_v<std::variant_alternative_t<std::variant_size_v<Message> - 1, Message>,
                             LoadReport>);

MessageType TypeOf(const Message& message) {
  // The variant's alternatives are listed in MessageType order, starting at 1.
  return static_cast<MessageType>(message.index() + 1);
}

Result<std::string> EncodeMessage(const Message& message) {
  const MessageType type = TypeOf(message);
  PD_RETURN_IF_ERROR(
      CheckMessage(message).WithContext(fmt::format("cannot encode {}", MessageTypeName(type))));
  ByteWriter w;
  w.U32(kMagic);
  w.U16(kProtocolVersion);
  w.U16(static_cast<uint16_t>(type));
  w.U32(0);  // body length, patched below
  w.U64(TransferIdOf(message));
  WriteBody(w, message);
  if (w.size() > kMaxMessageBytes) {
    return Status::InvalidArgument(fmt::format("{} encodes to {} bytes (at most {})",
                                               MessageTypeName(type), w.size(), kMaxMessageBytes));
  }
  w.PatchU32(kBodyLengthOffset, static_cast<uint32_t>(w.size() - kHeaderBytes));
  return w.Take();
}

std::string EncodeContextBuffer(const ContextBuffer& buffer) {
  ByteWriter w;
  w.U64(buffer.offset);
  w.U32(buffer.bytes);
  return w.Take();
}

Result<ContextBuffer> ParseContextBuffer(std::string_view bytes) {
  ByteReader r(bytes);
  ContextBuffer b;
  PD_RETURN_IF_ERROR(r.U64("context buffer offset", &b.offset));
  PD_RETURN_IF_ERROR(r.U32("context buffer bytes", &b.bytes));
  if (r.remaining() != 0 || b.bytes == 0) {
    return Status::ProtocolError("a context buffer is a u64 offset and a positive u32 length");
  }
  return b;
}

Result<Message> DecodeMessage(std::string_view bytes) {
  ByteReader r(bytes);
  uint32_t magic = 0;
  uint16_t version = 0;
  PD_RETURN_IF_ERROR(r.U32("magic", &magic));
  if (magic != kMagic) {
    return Status::ProtocolError(
        fmt::format("not a pdserve messenger message (magic {:#010x})", magic));
  }
  // The version is checked before anything else a later version might lay out differently.
  PD_RETURN_IF_ERROR(r.U16("version", &version));
  if (version != kProtocolVersion) {
    return Status::ProtocolError(
        fmt::format("peer speaks messenger protocol version {}, this build speaks version {}",
                    version, kProtocolVersion));
  }
  if (bytes.size() > kMaxMessageBytes) {
    return Status::ProtocolError(
        fmt::format("message of {} bytes exceeds the cap of {}", bytes.size(), kMaxMessageBytes));
  }
  uint16_t raw_type = 0;
  uint32_t body_length = 0;
  uint64_t transfer_id = 0;
  PD_RETURN_IF_ERROR(r.U16("type", &raw_type));
  PD_RETURN_IF_ERROR(r.U32("body length", &body_length));
  PD_RETURN_IF_ERROR(r.U64("transfer id", &transfer_id));
  if (body_length != r.remaining()) {
    return Status::ProtocolError(fmt::format(
        "length field says {} body bytes but {} follow the header", body_length, r.remaining()));
  }
  if (!IsKnownType(raw_type)) {
    return Status::ProtocolError(fmt::format("unknown message type {}", raw_type));
  }
  const MessageType type = static_cast<MessageType>(raw_type);
  const std::string_view name = MessageTypeName(type);
  if (!CarriesTransferId(type) && transfer_id != 0) {
    return Status::ProtocolError(fmt::format("{} carries transfer id {}", name, transfer_id));
  }
  auto message = ReadBody(r, type, transfer_id);
  if (!message.ok())
    return Status::ProtocolError(fmt::format("{}: {}", name, message.status().message()));
  if (r.remaining() != 0) {
    return Status::ProtocolError(fmt::format("{}: {} bytes after the body", name, r.remaining()));
  }
  const Status valid = CheckMessage(*message);
  if (!valid.ok()) return Status::ProtocolError(fmt::format("{}: {}", name, valid.message()));
  return message;
}

}  // namespace pdserve::messenger
