// ModelIdentity (common/model_identity.h): the exact string the handshake has always carried,
// a strict inverse for it, and a comparison that names each differing field.
#include "common/model_identity.h"

#include <string>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

const ModelIdentity kTiny{
    .config = 0x0123456789abcdef, .files = "00112233445566778899aabbccddeeff", .weights = "bf16"};

TEST(ModelIdentityTest, SerializesAsTheHandshakeString) {
  EXPECT_EQ(kTiny.Serialize(),
            "config=0123456789abcdef;files=00112233445566778899aabbccddeeff;weights=bf16;kv=plain");
  EXPECT_EQ(
      (ModelIdentity{.config = 0x2a, .files = "f", .weights = "auto", .kv = "mtp"}).Serialize(),
      "config=000000000000002a;files=f;weights=auto;kv=mtp");
}

TEST(ModelIdentityTest, ParseIsTheInverseOfSerialize) {
  for (const ModelIdentity& id :
       {kTiny, ModelIdentity{},
        ModelIdentity{.config = ~uint64_t{0}, .files = "", .weights = "", .kv = ""}}) {
    auto parsed = ModelIdentity::Parse(id.Serialize());
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, id);
    EXPECT_EQ(parsed->Serialize(), id.Serialize());
  }
}

TEST(ModelIdentityTest, ParseRefusesAnythingElse) {
  for (const char* text : {
           "", "sha256:0123456789abcdef",
           "config=0123456789abcdef;files=x",                                // a field missing
           "config=0123456789abcdef;files=x;weights=bf16",                   // no kv
           "config=0123456789abcdef;files=x;weights=bf16;kv=plain;extra=1",  // one too many
           "files=x;config=0123456789abcdef;weights=bf16",                   // out of order
           "config=0123456789ABCDEF;files=x;weights=bf16",                   // not canonical hex
           "config=123456789abcdef;files=x;weights=bf16",                    // 15 digits
           "config=0123456789abcdefg;files=x;weights=bf16",                  // 17 characters
           "config=0123456789abcdex;files=x;weights=bf16",                   // not hex
           "config0123456789abcdef;files=x;weights=bf16",                    // no '='
           "configs=0123456789abcdef;files=x;weights=bf16",                  // another key
       }) {
    SCOPED_TRACE(text);
    EXPECT_EQ(ModelIdentity::Parse(text).status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(ModelIdentityTest, CompareNamesEachDifferingField) {
  EXPECT_TRUE(ModelIdentity::Compare(kTiny, "a", kTiny, "b").empty());

  ModelIdentity checkpoint = kTiny;
  checkpoint.files = "ffeeddccbbaa99887766554433221100";
  EXPECT_EQ(ModelIdentity::Compare(checkpoint, "prefill", kTiny, "decode"),
            std::vector<std::string>{"model weights differ (another checkpoint): prefill "
                                     "files=ffeeddccbbaa99887766554433221100, decode "
                                     "files=00112233445566778899aabbccddeeff"});

  ModelIdentity dtype = kTiny;
  dtype.weights = "f32";
  EXPECT_EQ(ModelIdentity::Compare(kTiny, "P", dtype, "D"),
            std::vector<std::string>{
                "weight dtype or format differs (--dtype/--weights: the KV would differ): P "
                "weights=bf16, D weights=f32"});

  ModelIdentity mtp = kTiny;
  mtp.kv = "mtp";
  EXPECT_EQ(ModelIdentity::Compare(kTiny, "prefill", mtp, "decode"),
            std::vector<std::string>{
                "speculation differs (--speculative mtp on one node only: the MTP module's KV "
                "layer would be missing): prefill kv=plain, decode kv=mtp"});

  // Another config: its files differ too, but that says nothing more.
  ModelIdentity shape = checkpoint;
  shape.config = 1;
  EXPECT_EQ(
      ModelIdentity::Compare(shape, "prefill", kTiny, "decode"),
      std::vector<std::string>{"model config differs (another architecture or shape): prefill "
                               "config=0000000000000001, decode config=0123456789abcdef"});
}

}  // namespace
}  // namespace pdserve
