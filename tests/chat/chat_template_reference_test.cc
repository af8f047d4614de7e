// Compares pdserve's chat-template renders with Python jinja2's, configured as Hugging Face
// transformers' apply_chat_template (fixtures/render_reference.py). The cases
// (fixtures/reference_cases.json) cover what diverged before: tool definitions with unsorted
// keys (tojson must keep insertion order), Unicode whitespace in strip/split/trim and in
// whitespace control, chat_template_kwargs (Qwen3's enable_thinking), and transformers' tojson
// options. The expected outputs (fixtures/reference_renders.json) are committed;
// ReferenceRendersAreCurrent re-runs the script where /usr/bin/python3 has jinja2 and fails if
// they are stale, skipping loudly where it has not.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/chat_prompt.h"
#include "common/clock.h"
#include "testing/processes.h"
#include "testing/test_paths.h"

namespace pdserve::chat {
namespace {

using ::pdserve::testing::ReadFile;
using ojson = nlohmann::ordered_json;

const std::filesystem::path kFixtures = PDSERVE_CHAT_FIXTURES;
constexpr char kSharedPrefix[] = "shared:";

// Parsed in document order, as the server parses requests.
ojson ReadJson(const std::filesystem::path& path) {
  return ojson::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
}

const ojson& Cases() {
  static const ojson cases = ReadJson(kFixtures / "reference_cases.json");
  return cases;
}

const ojson& Renders() {
  static const ojson renders = ReadJson(kFixtures / "reference_renders.json");
  return renders;
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  if (!Cases().is_array()) return {"missing_or_invalid_reference_cases_json"};
  for (const ojson& c : Cases()) names.push_back(c.value("name", "unnamed"));
  return names;
}

const ojson* FindCase(const std::string& name) {
  if (!Cases().is_array()) return nullptr;
  for (const ojson& c : Cases()) {
    if (c.value("name", "") == name) return &c;
  }
  return nullptr;
}

class ChatTemplateReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateReferenceTest, MatchesPythonJinja2) {
  const ojson* c = FindCase(GetParam());
  ASSERT_NE(c, nullptr) << "no case " << GetParam() << " in " << kFixtures / "reference_cases.json";
  ASSERT_TRUE(Renders().is_object()) << "unreadable " << kFixtures / "reference_renders.json";
  auto expected = Renders().find(GetParam());
  ASSERT_NE(expected, Renders().end())
      << "no reference render for " << GetParam() << ": run fixtures/render_reference.py";

  const std::string template_name = c->at("template");
  std::string source;
  if (template_name.rfind(kSharedPrefix, 0) == 0) {
    const std::string config =
        template_name.substr(sizeof(kSharedPrefix) - 1) + "/tokenizer_config.json";
    PD_REQUIRE_SHARED(config);
    source = ReadJson(testing::SharedPath(config)).value("chat_template", "");
  } else {
    source = ReadFile(kFixtures / template_name);
  }
  ASSERT_FALSE(source.empty()) << "empty template " << template_name;
  auto renderer =
      ChatPromptRenderer::Create(source, c->value("bos_token", ""), c->value("eos_token", ""));
  ASSERT_TRUE(renderer->has_template()) << template_name << " does not parse";

  const ojson null;
  auto rendered =
      renderer->Render(c->at("messages"), c->contains("tools") ? c->at("tools") : null,
                       c->contains("chat_template_kwargs") ? c->at("chat_template_kwargs") : null,
                       c->value("add_generation_prompt", true));
  if (expected->is_object()) {  // the reference raised
    ASSERT_FALSE(rendered.ok()) << "rendered: " << rendered->text;
    EXPECT_NE(rendered.status().message().find(expected->at("error").get<std::string>()),
              std::string::npos)
        << rendered.status().ToString();
    return;
  }
  ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
  EXPECT_EQ(rendered->text, expected->get<std::string>());
}

INSTANTIATE_TEST_SUITE_P(Cases, ChatTemplateReferenceTest, ::testing::ValuesIn(CaseNames()),
                         [](const auto& info) { return info.param; });

// The committed renders are what the reference produces today from the committed cases.
TEST(ChatTemplateReferenceFreshnessTest, ReferenceRendersAreCurrent) {
  if (std::system("/usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "REFERENCE NOT CHECKED: /usr/bin/python3 with jinja2 is missing "
                    "(scripts/install-deps.sh installs python3-jinja2); the committed "
                    "reference_renders.json is used unverified";
  }
  PD_REQUIRE_SHARED("tokenizers/qwen2/tokenizer_config.json");  // a case renders its template
  const std::string out = testing::MakeTempDir("chat_reference") + "/renders.json";
  const testing::CommandRun run = testing::RunToCompletion(
      {"/usr/bin/python3", (kFixtures / "render_reference.py").string(), "--out", out},
      Deadline::AfterMs(120'000), {.env = {{"PDSERVE_SHARED_DIR", testing::SharedPath("")}}});
  ASSERT_TRUE(run.finished && run.exit.success()) << run.exit.ToString() << "\n" << run.output;
  const std::string fresh = ReadFile(out);
  std::filesystem::remove_all(std::filesystem::path(out).parent_path());
  ASSERT_FALSE(fresh.empty());
  EXPECT_EQ(fresh, ReadFile(kFixtures / "reference_renders.json"))
      << "fixtures/reference_renders.json is stale: run /usr/bin/python3 "
         "tests/chat/fixtures/render_reference.py";
}

}  // namespace
}  // namespace pdserve::chat
