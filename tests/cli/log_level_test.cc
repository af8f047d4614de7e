// PDSERVE_LOG_LEVEL: a level name sets the level; any other value is warned about and logging
// stays at info (spdlog alone would read it as "off" and silence every log, errors included).
#include <string>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "common/logging.h"
#include "testing/processes.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

testing::CommandRun GenerateWithLogLevel(const std::string& level) {
  return testing::RunPdserve({"generate", "--model", testing::TinyModelDir(), "--prompt", "a",
                              "--max-tokens", "1", "--threads", "1"},
                             Deadline::AfterMs(120'000),
                             {.env = {{"PDSERVE_LOG_LEVEL", level}}, .separate_stderr = true});
}

TEST(LogLevelTest, AnUnknownLevelIsWarnedAboutAndLoggingStaysAtInfo) {
  const testing::CommandRun run = GenerateWithLogLevel("verbose");
  ASSERT_TRUE(run.finished && run.exit.success()) << run.exit.ToString() << "\n" << run.errors;
  EXPECT_NE(run.errors.find("PDSERVE_LOG_LEVEL='verbose' names no level"), std::string::npos)
      << run.errors;
  EXPECT_NE(run.errors.find("kernels: "), std::string::npos) << run.errors;  // an info line
}

TEST(LogLevelTest, ALevelNameSetsTheLevel) {
  const testing::CommandRun quiet = GenerateWithLogLevel("error");
  ASSERT_TRUE(quiet.finished && quiet.exit.success()) << quiet.exit.ToString();
  EXPECT_EQ(quiet.errors.find("kernels: "), std::string::npos) << quiet.errors;
  EXPECT_EQ(quiet.errors.find("names no level"), std::string::npos) << quiet.errors;

  InitLogging();
  EXPECT_TRUE(SetLogLevel("debug"));
  EXPECT_EQ(spdlog::get_level(), spdlog::level::debug);
  EXPECT_FALSE(SetLogLevel("verbose"));
  EXPECT_EQ(spdlog::get_level(), spdlog::level::debug);
  EXPECT_TRUE(SetLogLevel("info"));
}

}  // namespace
}  // namespace pdserve
