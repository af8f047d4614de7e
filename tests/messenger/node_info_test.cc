// MakeLocalNodeInfo for a node of several tensor-parallel ranks, and the handshake check
// between nodes of different TP sizes.
#include "messenger/node_info.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/model_identity.h"
#include "kv/transfer_plan.h"

namespace pdserve::messenger {
namespace {

// Rank r's cache layout when `kv_heads` heads are split over `tp` ranks.
std::vector<KvLayout> RankLayouts(int kv_heads, int tp, int num_pages = 64) {
  auto shards = KvShardLayout::ForTensorParallel(kv_heads, tp);
  EXPECT_TRUE(shards.ok()) << shards.status().ToString();
  std::vector<KvLayout> layouts;
  for (int r = 0; r < tp; ++r) {
    layouts.push_back(KvLayout{.num_layers = 4,
                               .num_kv_heads = shards->heads(r).size(),
                               .head_dim = 16,
                               .page_tokens = 8,
                               .dtype = DType::kBF16,
                               .num_pages = num_pages});
  }
  return layouts;
}

std::vector<std::string> Descriptors(int tp) {
  std::vector<std::string> out;
  for (int r = 0; r < tp; ++r) out.push_back("desc" + std::to_string(r));
  return out;
}

TEST(MessengerNodeInfoTest, DescribesEveryRankWithItsShardAndDescriptor) {
  for (int tp : {1, 2, 3, 8}) {
    SCOPED_TRACE(tp);
    const std::vector<KvLayout> layouts = RankLayouts(8, tp);
    auto info = MakeLocalNodeInfo(8, layouts, Descriptors(tp), "fp", "avx2");
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    // The model's head count, not rank 0's share.
    EXPECT_EQ(info->kv.shards.total_kv_heads(), 8);
    EXPECT_EQ(info->kv.shards.tp_size(), tp);
    EXPECT_EQ(info->kv.ranks, layouts);
    EXPECT_EQ(info->rank_memory, Descriptors(tp));
    int covered = 0;
    for (int r = 0; r < tp; ++r) {
      EXPECT_EQ(info->kv.shards.heads(r).begin, covered);
      covered = info->kv.shards.heads(r).end;
    }
    EXPECT_EQ(covered, 8);
    // What goes on the wire comes back equal.
    auto bytes = EncodeMessage(HelloFinish{.proof = {}, .node = *info});
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto decoded = DecodeMessage(*bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(std::get<HelloFinish>(*decoded).node, *info);
  }
}

TEST(MessengerNodeInfoTest, ReplicatedHeadsWhenRanksOutnumberThem) {
  const std::vector<KvLayout> layouts = RankLayouts(2, 4);
  auto info = MakeLocalNodeInfo(2, layouts, Descriptors(4), "fp", "avx2");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->kv.shards.num_groups(), 2);
  EXPECT_EQ(info->kv.shards.heads(0), info->kv.shards.heads(1));
  EXPECT_EQ(info->kv.shards.heads(2), info->kv.shards.heads(3));
}

TEST(MessengerNodeInfoTest, RefusesARankWhoseCacheDoesNotHoldItsShard) {
  // Rank 1 holds every head, as a rank 0 layout copied to each rank would.
  std::vector<KvLayout> layouts = RankLayouts(8, 2);
  layouts[1].num_kv_heads = 8;
  auto info = MakeLocalNodeInfo(8, layouts, Descriptors(2), "fp", "avx2");
  ASSERT_EQ(info.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(info.status().message().find("rank 1"), std::string::npos) << info.status().message();
  // Rank 0's share taken as the model's head count.
  layouts = RankLayouts(8, 2);
  EXPECT_EQ(MakeLocalNodeInfo(4, layouts, Descriptors(2), "fp", "avx2").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MessengerNodeInfoTest, RefusesAMissingDescriptorOrNoRanks) {
  const std::vector<KvLayout> layouts = RankLayouts(8, 2);
  EXPECT_EQ(MakeLocalNodeInfo(8, layouts, Descriptors(1), "fp", "avx2").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLocalNodeInfo(8, {}, {}, "fp", "avx2").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MessengerNodeInfoTest, NodesOfDifferentTpAreCompatibleWhenTheModelIsTheSame) {
  for (auto [p_tp, d_tp] : {std::pair{1, 2}, {2, 1}, {2, 4}, {4, 2}, {8, 1}}) {
    SCOPED_TRACE(testing::Message() << "P tp " << p_tp << ", D tp " << d_tp);
    auto p = MakeLocalNodeInfo(8, RankLayouts(8, p_tp, 100), Descriptors(p_tp), "fp", "avx2");
    auto d = MakeLocalNodeInfo(8, RankLayouts(8, d_tp, 50), Descriptors(d_tp), "fp", "avx2");
    ASSERT_TRUE(p.ok() && d.ok());
    EXPECT_TRUE(CheckPeerCompatible(*p, *d).ok()) << CheckPeerCompatible(*p, *d).ToString();
    auto plan = TransferPlan::Create(p->kv, d->kv);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->source().shards.tp_size(), p_tp);
    EXPECT_EQ(plan->destination().shards.tp_size(), d_tp);
  }
  // Another model (other head count) is refused whatever the split.
  auto p = MakeLocalNodeInfo(8, RankLayouts(8, 2), Descriptors(2), "fp", "avx2");
  auto d = MakeLocalNodeInfo(4, RankLayouts(4, 1), Descriptors(1), "fp", "avx2");
  ASSERT_TRUE(p.ok() && d.ok());
  const Status s = CheckPeerCompatible(*p, *d);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("KV layout differs"), std::string::npos) << s.message();
}

// Model identities (common/model_identity.h) are compared field by field and the refusal says
// which; fingerprints of any other form are named whole.
TEST(MessengerNodeInfoTest, ModelDifferencesAreNamedByField) {
  const ModelIdentity tiny{
      .config = 0xabc, .files = "0123456789abcdef0123456789abcdef", .weights = "auto"};
  auto refusal = [](const ModelIdentity& p_model, const std::string& d_fingerprint) {
    auto p = MakeLocalNodeInfo(8, RankLayouts(8, 1), Descriptors(1), p_model.Serialize(), "avx2");
    auto d = MakeLocalNodeInfo(8, RankLayouts(8, 1), Descriptors(1), d_fingerprint, "avx2");
    EXPECT_TRUE(p.ok() && d.ok());
    const Status s = CheckPeerCompatible(*p, *d);
    EXPECT_EQ(s.code(), s.ok() ? StatusCode::kOk : StatusCode::kFailedPrecondition);
    return s.message();
  };
  EXPECT_EQ(refusal(tiny, tiny.Serialize()), "");  // compatible

  ModelIdentity other_checkpoint = tiny;
  other_checkpoint.files = "fedcba9876543210fedcba9876543210";
  EXPECT_EQ(
      refusal(other_checkpoint, tiny.Serialize()),
      "model weights differ (another checkpoint): prefill "
      "files=fedcba9876543210fedcba9876543210, decode files=0123456789abcdef0123456789abcdef");

  ModelIdentity other_shape = other_checkpoint;
  other_shape.config = 0xdef;
  other_shape.weights = "f32";
  EXPECT_EQ(refusal(other_shape, tiny.Serialize()),
            "model config differs (another architecture or shape): prefill "
            "config=0000000000000def, decode config=0000000000000abc; weight dtype or format "
            "differs (--dtype/--weights: the KV would differ): prefill weights=f32, decode "
            "weights=auto");

  EXPECT_EQ(refusal(tiny, "sha256:00"),
            "model differs: prefill fingerprint '" + tiny.Serialize() + "', decode 'sha256:00'");
}

}  // namespace
}  // namespace pdserve::messenger
