#include "common/subprocess.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "testing/processes.h"

namespace pdserve {
namespace {

// `/bin/sh -c script` with the given streams.
SubprocessOptions Shell(const std::string& script) {
  SubprocessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  return options;
}

// The text, or the error as text (which the comparison after it then shows).
std::string Text(const Result<std::string>& result) {
  return result.ok() ? *result : "<" + result.status().ToString() + ">";
}

// The status, or ExitStatus{} (code -1) if waiting failed.
ExitStatus Exit(const Result<ExitStatus>& result) { return result.ok() ? *result : ExitStatus{}; }

using testing::ProcessAlive;

TEST(SubprocessTest, ReportsTheExitCode) {
  auto process = Subprocess::Spawn(Shell("exit 7"));
  ASSERT_TRUE(process.ok()) << process.status().ToString();
  auto status = process->WaitFor(Deadline::AfterMs(10000));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_TRUE(status->exited());
  EXPECT_EQ(status->code, 7);
  EXPECT_FALSE(status->success());
  EXPECT_FALSE(process->running());
  EXPECT_EQ(status->ToString(), "exited with 7");
}

TEST(SubprocessTest, ReportsTheKillingSignal) {
  SubprocessOptions options = Shell("echo started; exec sleep 30");
  options.stdout_mode = StdStream::kPipe;
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok()) << process.status().ToString();
  ASSERT_EQ(Text(process->ReadLine(Deadline::AfterMs(10000))), "started");
  ASSERT_TRUE(process->Signal(SIGTERM).ok());
  auto status = process->WaitFor(Deadline::AfterMs(10000));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_FALSE(status->exited());
  EXPECT_EQ(status->signal, SIGTERM);
  // Reaped: signalling again is refused rather than hitting a recycled pid.
  EXPECT_FALSE(process->Signal(SIGTERM).ok());
}

TEST(SubprocessTest, ExpiredDeadlineLeavesTheChildRunningAndDestructionKillsIt) {
  pid_t pid = -1;
  {
    auto process = Subprocess::Spawn(Shell("exec sleep 30"));
    ASSERT_TRUE(process.ok()) << process.status().ToString();
    pid = process->pid();
    const TimePoint start = Clock::now();
    auto status = process->WaitFor(Deadline::AfterMs(100));
    EXPECT_EQ(status.status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_GE(SecondsSince(start), 0.09);
    EXPECT_LT(SecondsSince(start), 5.0);
    EXPECT_TRUE(process->running());
    EXPECT_TRUE(ProcessAlive(pid));
  }
  // Destroyed: killed and reaped (not even a zombie is left).
  EXPECT_NE(kill(pid, 0), 0);
}

TEST(SubprocessTest, CapturesStdoutAndStderrAndPassesEnvironment) {
  SubprocessOptions options = Shell("echo one; echo \"two $PD_SUBPROCESS_TEST\" >&2; printf three");
  options.env = {{"PD_SUBPROCESS_TEST", "from-parent"}};
  options.stdout_mode = StdStream::kPipe;
  options.stderr_mode = StdStream::kPipe;
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok()) << process.status().ToString();
  EXPECT_EQ(Text(process->ReadLine(Deadline::AfterMs(10000))), "one");
  EXPECT_EQ(Text(process->ReadLine(Deadline::AfterMs(10000))), "two from-parent");
  // The unterminated last line comes at EOF, then EOF is an error.
  EXPECT_EQ(Text(process->ReadLine(Deadline::AfterMs(10000))), "three");
  EXPECT_EQ(process->ReadLine(Deadline::AfterMs(10000)).status().code(), StatusCode::kUnavailable);
  auto status = process->WaitFor(Deadline::AfterMs(10000));
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(status->success());
}

TEST(SubprocessTest, StdinPipeAndReadAll) {
  SubprocessOptions options = Shell("while read line; do echo \"got $line\"; done");
  options.stdin_mode = StdStream::kPipe;
  options.stdout_mode = StdStream::kPipe;
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok()) << process.status().ToString();
  ASSERT_TRUE(process->WriteStdin("a\nb\n", Deadline::AfterMs(10000)).ok());
  EXPECT_EQ(Text(process->ReadLine(Deadline::AfterMs(10000))), "got a");
  process->CloseStdin();
  EXPECT_EQ(Text(process->ReadAll(Deadline::AfterMs(10000))), "got b\n");
  EXPECT_TRUE(Exit(process->WaitFor(Deadline::AfterMs(10000))).success());
}

TEST(SubprocessTest, ReadLineDeadlineExpiresOnASilentChild) {
  SubprocessOptions options = Shell("exec sleep 30");
  options.stdout_mode = StdStream::kPipe;
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok());
  EXPECT_EQ(process->ReadLine(Deadline::AfterMs(100)).status().code(),
            StatusCode::kDeadlineExceeded);
}

TEST(SubprocessTest, WritingToAChildThatExitedIsAnErrorNotSigpipe) {
  SubprocessOptions options = Shell("exit 0");
  options.stdin_mode = StdStream::kPipe;
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok());
  ASSERT_TRUE(process->WaitFor(Deadline::AfterMs(10000)).ok());
  EXPECT_FALSE(process->WriteStdin("hello\n", Deadline::AfterMs(1000)).ok());
}

TEST(SubprocessTest, StdoutToAFile) {
  const std::string path = ::testing::TempDir() + "subprocess_test_" + std::to_string(getpid());
  SubprocessOptions options = Shell("echo to-file");
  options.stdout_mode = StdStream::kFile;
  options.stdout_path = path;
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok()) << process.status().ToString();
  ASSERT_TRUE(process->WaitFor(Deadline::AfterMs(10000)).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "to-file\n");
  std::remove(path.c_str());
}

TEST(SubprocessTest, GroupSignalReachesGrandchildren) {
  SubprocessOptions options = Shell("sleep 30 & echo $!; wait");
  options.stdout_mode = StdStream::kPipe;
  options.new_process_group = true;
  auto process = Subprocess::Spawn(options);
  ASSERT_TRUE(process.ok());
  auto line = process->ReadLine(Deadline::AfterMs(10000));
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  const pid_t grandchild = std::stoi(*line);
  ASSERT_TRUE(ProcessAlive(grandchild));
  ASSERT_TRUE(process->Signal(SIGKILL, /*group=*/true).ok());
  ASSERT_TRUE(process->WaitFor(Deadline::AfterMs(10000)).ok());
  // The grandchild is reparented and reaped by init; give that a moment.
  const Deadline deadline = Deadline::AfterMs(10000);
  while (ProcessAlive(grandchild) && !deadline.Passed()) usleep(10000);
  EXPECT_FALSE(ProcessAlive(grandchild));
}

// A child started with SIGINT/SIGTERM ignored outlives both (sent to itself, as a terminal's
// Ctrl-C would reach it); without the option the same script dies of the first.
TEST(SubprocessTest, IgnoredSignalsStayIgnoredAcrossExec) {
  const std::string script = "kill -INT $$; kill -TERM $$; echo survived";
  SubprocessOptions options = Shell(script);
  options.stdout_mode = StdStream::kPipe;
  options.ignored_signals = {SIGINT, SIGTERM};
  auto ignoring = Subprocess::Spawn(options);
  ASSERT_TRUE(ignoring.ok());
  EXPECT_EQ(Text(ignoring->ReadAll(Deadline::AfterMs(10000))), "survived\n");
  EXPECT_TRUE(Exit(ignoring->WaitFor(Deadline::AfterMs(10000))).success());

  options.ignored_signals.clear();
  auto plain = Subprocess::Spawn(options);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Text(plain->ReadAll(Deadline::AfterMs(10000))), "");
  EXPECT_EQ(Exit(plain->WaitFor(Deadline::AfterMs(10000))).signal, SIGINT);
}

TEST(SubprocessTest, BadArgumentsAreErrors) {
  EXPECT_EQ(Subprocess::Spawn(SubprocessOptions{}).status().code(), StatusCode::kInvalidArgument);
  SubprocessOptions missing;
  missing.argv = {"pdserve-no-such-program-anywhere"};
  EXPECT_EQ(Subprocess::Spawn(missing).status().code(), StatusCode::kInvalidArgument);
  SubprocessOptions bad_file = Shell("true");
  bad_file.stdout_mode = StdStream::kFile;
  bad_file.stdout_path = "/nonexistent-dir/out";
  EXPECT_FALSE(Subprocess::Spawn(bad_file).ok());
  // A program that exists but cannot run: the child exits 127.
  SubprocessOptions not_executable;
  not_executable.argv = {"/dev/null"};
  auto process = Subprocess::Spawn(not_executable);
  ASSERT_TRUE(process.ok());
  EXPECT_EQ(Exit(process->WaitFor(Deadline::AfterMs(10000))).code, 127);
}

TEST(SubprocessTest, MoveTransfersOwnership) {
  auto spawned = Subprocess::Spawn(Shell("exit 3"));
  ASSERT_TRUE(spawned.ok());
  Subprocess moved = std::move(*spawned);
  EXPECT_EQ(spawned->pid(), -1);
  EXPECT_EQ(Exit(moved.WaitFor(Deadline::AfterMs(10000))).code, 3);
}

}  // namespace
}  // namespace pdserve
