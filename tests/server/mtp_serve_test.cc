// `--speculative mtp` through the real binary: `pdserve generate` with the model's own MTP
// module gives the tokens it gives without speculation, on one rank and on two tensor-parallel
// ranks (every rank runs the module's drafting passes), while drafts are accepted; a model
// without an MTP module is refused at start-up.
#include <gtest/gtest.h>

#include "testing/node_process.h"
#include "testing/processes.h"
#include "testing/test_paths.h"

namespace pdserve::testing {
namespace {

using json = nlohmann::json;

std::string MtpServeTarget() {
  return SyntheticModelDir(
      "deepseek-v3-tiny",
      {.quiet_from_layer = 0, .quiet_scale = 0.01f, .head_scale = 8.0f, .mtp_mimic = true});
}

json GenerateMtp(const std::string& model, const std::vector<std::string>& extra, int* code) {
  std::vector<std::string> args = {"generate",      "--model",
                                   model,           "--json",
                                   "--prompt-ids",  "[5, 17, 99, 3, 250, 41, 7]",
                                   "--max-tokens",  "48",
                                   "--temperature", "0",
                                   "--ignore-eos"};
  args.insert(args.end(), extra.begin(), extra.end());
  const std::string out = RunPdserve(args, code);
  return json::parse(out, nullptr, false);
}

TEST(MtpServeTest, GenerateWithTheMtpModuleGivesTheSameTokens) {
  int code = 0;
  const json plain = GenerateMtp(MtpServeTarget(), {}, &code);
  ASSERT_EQ(code, 0) << plain.dump();
  const auto want = plain["token_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(want.size(), 48u);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--speculative", "mtp", "--num-speculative-tokens", "3"},
        std::vector<std::string>{"--tp", "2", "--speculative", "mtp", "--num-speculative-tokens",
                                 "5"}}) {
    const json got = GenerateMtp(MtpServeTarget(), extra, &code);
    ASSERT_EQ(code, 0) << got.dump();
    EXPECT_EQ(got["token_ids"].get<std::vector<int32_t>>(), want) << extra[1];
  }
}

TEST(MtpServeTest, AModelWithoutAnMtpModuleIsRefusedAtStartUp) {
  const CommandRun run = RunPdserve({"generate", "--model", SyntheticModelDir("tiny"), "--prompt",
                                     "Once", "--max-tokens", "4", "--speculative", "mtp"},
                                    Deadline::After(std::chrono::seconds(120)));
  ASSERT_TRUE(run.finished);
  EXPECT_FALSE(run.exit.success()) << run.output;
  EXPECT_NE(run.output.find("MTP module"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pdserve::testing
