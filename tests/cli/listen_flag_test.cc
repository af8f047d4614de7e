// `pdserve serve` and `pdserve router` refuse a --listen that is not HOST:PORT with an error that
// names the flag and the text given, and exit at once (no model loaded, no socket opened).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/clock.h"
#include "testing/processes.h"
#include "testing/test_models.h"

namespace pdserve {
namespace {

TEST(ListenFlagTest, ServeAndRouterRefuseAnAddressThatIsNotHostPort) {
  const std::vector<std::string> bad = {
      "8000",          ":8000",        "127.0.0.1:",    "127.0.0.1:65536",
      "127.0.0.1:80x", "127.0.0.1:-1", "127.0.0.1: 80", "127.0.0.1:99999999999"};
  for (const std::string command : {"serve", "router"}) {
    for (const std::string& listen : bad) {
      std::vector<std::string> args{command, "--listen", listen};
      if (command == "serve") args.insert(args.end(), {"--model", testing::TinyModelDir()});
      const testing::CommandRun run = testing::RunPdserve(args, Deadline::AfterMs(60'000));
      SCOPED_TRACE(command + " --listen '" + listen + "'");
      EXPECT_TRUE(run.finished && run.exit.exited() && run.exit.code != 0)
          << run.exit.ToString() << "\n"
          << run.output;
      EXPECT_NE(run.output.find("--listen must be HOST:PORT"), std::string::npos) << run.output;
      EXPECT_NE(run.output.find("'" + listen + "'"), std::string::npos) << run.output;
    }
  }
}

}  // namespace
}  // namespace pdserve
