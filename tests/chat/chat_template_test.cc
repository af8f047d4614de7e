// Tests of the chat-template Jinja subset: syntax, semantics, errors and limits.
#include "chat/chat_template.h"

#include <string>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

// EXPECT that `status` is an InvalidArgument whose message contains `needle`.
#define EXPECT_ERROR_HAS(status, needle)                                      \
  do {                                                                        \
    const Status s_ = (status);                                               \
    EXPECT_EQ(s_.code(), StatusCode::kInvalidArgument) << s_.ToString();      \
    EXPECT_NE(s_.message().find(needle), std::string::npos) << s_.ToString(); \
  } while (0)

// Renders `source` with `messages` (and options); fails the test on any error.
std::string RenderOk(const std::string& source,
                     const nlohmann::json& messages = nlohmann::json::array(),
                     ChatRenderOptions options = {}) {
  auto tmpl = ChatTemplate::Parse(source);
  EXPECT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  if (!tmpl.ok()) return "<parse error>";
  auto out = tmpl->Render(messages, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : "<render error>";
}

Status RenderError(const std::string& source,
                   const nlohmann::json& messages = nlohmann::json::array(),
                   ChatRenderOptions options = {}) {
  auto tmpl = ChatTemplate::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  auto out = tmpl->Render(messages, options);
  if (out.ok()) return Status::Internal("rendered without error: " + *out);
  return out.status();
}

TEST(ChatTemplateTest, ChatMlConversation) {
  const std::string source =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  nlohmann::json messages = {{{"role", "user"}, {"content", "Hi"}}};
  EXPECT_EQ(RenderOk(source, messages), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(RenderOk(source, messages, no_prompt), "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplateTest, FallbackIsPlainText) {
  nlohmann::json messages = {{{"role", "system"}, {"content", "Be brief."}},
                             {{"role", "user"},
                              {"content",
                               {{{"type", "text"}, {"text", "Hi "}},
                                {{"type", "image_url"}},
                                {{"type", "text"}, {"text", "there"}}}}}};
  ChatRenderOptions options;
  options.bos_token = "<s>";
  auto out = ChatTemplate::Fallback().Render(messages, options);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "<s>system: Be brief.\n\nuser: Hi there\n\nassistant:");
}

TEST(ChatTemplateTest, SyntaxErrorNamesLineAndColumn) {
  auto tmpl = ChatTemplate::Parse("hello\n{% if x %}\n{{ 1 + }}\n{% endif %}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_ERROR_HAS(tmpl.status(), "line 3 col");
}

TEST(ChatTemplateTest, RaiseExceptionSurfacesTheTemplatesMessage) {
  Status s = RenderError("{{ raise_exception('roles must alternate') }}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "chat template: roles must alternate");
}

TEST(ChatTemplateTest, WhitespaceControlTrimBlocksAndLstripBlocks) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(RenderOk("{% if true %}\n  yes\n{% endif %}\nafter"), "  yes\nafter");
  EXPECT_EQ(RenderOk("a\n    {% if true %}\nb\n    {% endif %}\nc"), "a\nb\nc");
  // `-` strips all whitespace, including newlines, on its side.
  EXPECT_EQ(RenderOk("a  \n {{- 'b' -}} \n  c"), "abc");
  EXPECT_EQ(RenderOk("x {%- if true -%} \n y {%- endif %}"), "xy");
  // Expression tags keep the newline after them; comments vanish.
  EXPECT_EQ(RenderOk("{{ 'a' }}\n{# note #}\nb"), "a\nb");
}

TEST(ChatTemplateTest, UndefinedBehavesLikeJinjaDefaultUndefined) {
  EXPECT_EQ(RenderOk("[{{ missing }}]"), "[]");
  EXPECT_EQ(RenderOk("{{ missing is defined }} {{ missing is undefined }}"), "False True");
  EXPECT_EQ(RenderOk("{% for x in missing %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(RenderOk("{{ missing | default('d') }} {{ '' | default('e', true) }}"), "d e");
  EXPECT_EQ(RenderOk("{{ messages[0].nope is defined }}", {{{"role", "user"}}}), "False");
  EXPECT_EQ(RenderOk("{% if not missing %}falsy{% endif %}"), "falsy");
  EXPECT_ERROR_HAS(RenderError("{{ missing.attr }}"), "'missing' is undefined");
  EXPECT_ERROR_HAS(RenderError("{{ missing + 'x' }}"), "'missing' is undefined");
}

TEST(ChatTemplateTest, LoopVariablesReverseLoopsFiltersAndUnpacking) {
  nlohmann::json messages = {{{"role", "a"}}, {{"role", "b"}}, {{"role", "c"}}};
  EXPECT_EQ(RenderOk("{% for m in messages %}{{ loop.index0 }}{{ loop.index }}{{ m.role }}"
                     "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex0 }};"
                     "{% endfor %}",
                     messages),
            "01aTrueFalse32;12bFalseFalse31;23cFalseTrue30;");
  EXPECT_EQ(RenderOk("{% for m in messages[::-1] %}{{ m.role }}{% endfor %}", messages), "cba");
  EXPECT_EQ(RenderOk("{% for m in messages if m.role != 'b' %}{{ m.role }}{{ loop.index }}"
                     "{% endfor %}",
                     messages),
            "a1c2");
  EXPECT_EQ(RenderOk("{% for k, v in {'x': 1, 'y': 2}.items() %}{{ k }}={{ v }},{% endfor %}"),
            "x=1,y=2,");
  EXPECT_EQ(RenderOk("{% for i in range(10) %}{% if i == 4 %}{% break %}{% endif %}"
                     "{% if i % 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(RenderOk("{% for c in 'héllo' %}{{ c }}.{% endfor %}"), "h.é.l.l.o.");
}

TEST(ChatTemplateTest, SetScopingAndNamespaces) {
  // A set inside a loop does not leak out of it (Jinja scoping); a namespace attribute does.
  EXPECT_EQ(RenderOk("{% set x = 1 %}{% for i in range(3) %}{% set x = i %}{% endfor %}{{ x }}"),
            "1");
  EXPECT_EQ(RenderOk("{% set ns = namespace(x=1, found=false) %}{% for i in range(3) %}"
                     "{% set ns.x = ns.x + i %}{% set ns.found = true %}{% endfor %}"
                     "{{ ns.x }} {{ ns.found }}"),
            "4 True");
  EXPECT_EQ(RenderOk("{% if true %}{% set y = 'in if' %}{% endif %}{{ y }}"), "in if");
  EXPECT_EQ(RenderOk("{% set block %}a{{ 1 + 1 }}b{% endset %}[{{ block }}]"), "[a2b]");
  EXPECT_ERROR_HAS(RenderError("{% set s = 'x' %}{% set s.attr = 1 %}"), "namespace");
}

TEST(ChatTemplateTest, StringMethods) {
  EXPECT_EQ(RenderOk("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} "
                     "{{ 'abc'.startswith('c') }}"),
            "True True False");
  EXPECT_EQ(
      RenderOk("{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a-b-c'.split('-', 1) }}"),
      "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b-c']");
  EXPECT_EQ(RenderOk("[{{ '\\n x \\n'.strip() }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}]"
                     "[{{ 'xyyzz'.rstrip('z') }}][{{ '--x--'.strip('-') }}]"),
            "[x][x\n][xyy][x]");
  EXPECT_EQ(RenderOk("{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} "
                     "{{ 'a.b.a'.replace('a', 'x') }} {{ ', '.join(['p', 'q']) }}"),
            "HELLO hello Hello World x.b.x p, q");
  EXPECT_EQ(
      RenderOk("{{ 'x</think>y'.split('</think>')[-1] }}|{{ 'héllo'[1] }}|{{ 'héllo'[1:3] }}"),
      "y|é|él");
}

TEST(ChatTemplateTest, Filters) {
  EXPECT_EQ(RenderOk("{{ [1, 2, 3] | length }} {{ 'héllo' | length }} {{ {'a': 1} | count }}"),
            "3 5 1");
  EXPECT_EQ(
      RenderOk("[{{ '  x y \\n' | trim }}] {{ 42 | string }}{{ 'A' | lower }}{{ 'b' | upper }}"),
      "[x y] 42aB");
  EXPECT_EQ(RenderOk("{{ ['a', 'b'] | join(', ') }}|{{ [1, 2] | first }}{{ [1, 2] | last }}"),
            "a, b|12");
  nlohmann::json people = {{{"name", "ann"}, {"role", "user"}},
                           {{"name", "bob"}, {"role", "assistant"}},
                           {{"name", "cy"}, {"role", "user"}}};
  EXPECT_EQ(RenderOk("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='name') "
                     "| join('+') }} {{ messages | rejectattr('role', 'eq', 'user') | list "
                     "| length }}",
                     people),
            "ann+cy 1");
  EXPECT_EQ(RenderOk("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [3, 1, 2] | sort }} "
                     "{{ [1, 1, 2] | unique | list }} {{ [1, 2] | reverse | list }}"),
            "[1, 3] [1, 2, 3] [1, 2] [2, 1]");
  EXPECT_EQ(RenderOk("{{ {'b': 1, 'a': 2} | dictsort }} {{ {'k': 'v'} | items | list }}"),
            "[['a', 2], ['b', 1]] [['k', 'v']]");
  EXPECT_EQ(RenderOk("{{ 'a\\nb' | indent(2) }}|{{ '3' | int + 1 }}|{{ 'x' | int }}|"
                     "{{ '2.5' | float }}|{{ -3 | abs }}|{{ 'a.b' | replace('.', '/') }}"),
            "a\n  b|4|0|2.5|3|a/b");
}

TEST(ChatTemplateTest, ToJsonMatchesPythonJsonDumps) {
  nlohmann::json messages = {{{"text", "é \"q\" \\ \n\t\x01"},
                              {"n", 1},
                              {"f", 1.5},
                              {"b", true},
                              {"z", nullptr},
                              {"l", nlohmann::json::array()},
                              {"o", nlohmann::json::object()}}};
  EXPECT_EQ(RenderOk("{{ messages[0] | tojson }}", messages),
            "{\"b\": true, \"f\": 1.5, \"l\": [], \"n\": 1, \"o\": {}, "
            "\"text\": \"é \\\"q\\\" \\\\ \\n\\t\\u0001\", \"z\": null}");
  EXPECT_EQ(RenderOk("{{ {'a': [1, {'b': 2}]} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}");
  EXPECT_EQ(RenderOk("{{ 'text' | tojson }} {{ 2.0 | tojson }} {{ none | tojson }}"),
            "\"text\" 2.0 null");
}

TEST(ChatTemplateTest, Tests) {
  EXPECT_EQ(RenderOk("{{ 'a' is string }}{{ 1 is string }}{{ {} is mapping }}{{ [] is mapping }}"
                     "{{ none is none }}{{ 1 is number }}{{ 'a' is iterable }}{{ 1 is iterable }}"),
            "TrueFalseTrueFalseTrueTrueTrueFalse");
  EXPECT_EQ(RenderOk("{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ 3 is even }}{{ x is not defined }}"
                     "{{ false is sameas false }}{{ 'u' is equalto 'u' }}{{ true is true }}"),
            "TrueTrueFalseTrueTrueTrueTrue");
  EXPECT_ERROR_HAS(RenderError("{{ 1 is frobnicated }}"), "no test named 'frobnicated'");
}

TEST(ChatTemplateTest, ExpressionsOperatorsAndLiterals) {
  EXPECT_EQ(RenderOk("{{ 'a' ~ 1 ~ none }} {{ 'a' + 'b' }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }}"),
            "a1None ab 7 9");
  EXPECT_EQ(
      RenderOk("{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 0.1 + 0.2 }}"),
      "3.5 3 -4 2 1024 0.30000000000000004");
  EXPECT_EQ(
      RenderOk("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [3] }}"),
      "True True True False");
  EXPECT_EQ(RenderOk("{{ 'yes' if 1 < 2 else 'no' }} [{{ 'x' if false }}] {{ none or 'd' }} "
                     "{{ 0 and 1 }} {{ not 0 }}"),
            "yes [] d 0 True");
  EXPECT_EQ(
      RenderOk("{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('z', 'dflt') }} {{ {'a': 1}.get('z') }}"
               " {{ {'a': 1}['a'] }} {{ [1, 2, 3][-1] }} {{ [1, 2, 3][5] is defined }}"),
      "1 dflt None 1 3 False");
  EXPECT_EQ(RenderOk("{{ [1, 2, 3][1:] }} {{ [1, 2, 3][:-1] }} {{ 'abc'[::-1] }} {{ (1, 'a') }}"),
            "[2, 3] [1, 2] cba [1, 'a']");
  EXPECT_EQ(RenderOk("{% if 1 > 2 %}a{% elif 2 > 1 %}b{% else %}c{% endif %}"), "b");
  EXPECT_ERROR_HAS(RenderError("{{ 'a' + 1 }}"), "unsupported operand types for +");
  EXPECT_ERROR_HAS(RenderError("{{ 1 // 0 }}"), "division by zero");
}

TEST(ChatTemplateTest, MacrosWithDefaultsAndKeywords) {
  EXPECT_EQ(RenderOk("{% macro tag(name, open=true) %}<{{ '' if open else '/' }}{{ name }}>"
                     "{% endmacro %}{{ tag('b') }}x{{ tag('b', open=false) }}"),
            "<b>x</b>");
  // Macros see template-level variables but not the caller's loop variables.
  EXPECT_EQ(RenderOk("{% set g = 'G' %}{% macro m() %}{{ g }}{{ i }}{% endmacro %}"
                     "{% for i in [1] %}{{ m() }}{% endfor %}"),
            "G");
}

TEST(ChatTemplateTest, SyntaxErrors) {
  const char* bad[] = {
      "{% if x %}unclosed",
      "{% for x in y %}",
      "{% endif %}",
      "{{ 'unterminated }}",
      "{{ x ",
      "{% frobnicate %}",
      "{{ [1, 2 }}",
      "{# never closed",
      "{% set %}",
      "{{ x | }}",
      "{% for in y %}{% endfor %}",
      "{{ 1 +* 2 }}",
      "{% if x %}{% else %}{% else %}{% endif %}",
      "{{ f(a=1, 2) }}",
  };
  for (const char* source : bad) {
    auto tmpl = ChatTemplate::Parse(source);
    ASSERT_FALSE(tmpl.ok()) << source;
    EXPECT_ERROR_HAS(tmpl.status(), "chat template line ");
  }
  auto tmpl = ChatTemplate::Parse("ok\n  {{ x |\n nosuchfilter }}");
  ASSERT_TRUE(tmpl.ok());  // unknown filters are a render error, as in Jinja's runtime
  auto out = tmpl->Render(nlohmann::json::array(), {});
  ASSERT_FALSE(out.ok());
  EXPECT_ERROR_HAS(out.status(), "no filter named 'nosuchfilter'");
  EXPECT_ERROR_HAS(out.status(), "line 2");
}

TEST(ChatTemplateTest, BadInputsAreErrors) {
  auto tmpl = ChatTemplate::Parse("{{ messages }}");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_ERROR_HAS(tmpl->Render(nlohmann::json::object(), {}).status(), "messages must be");
  ChatRenderOptions options;
  options.extra = nlohmann::json::array();
  EXPECT_ERROR_HAS(tmpl->Render(nlohmann::json::array(), options).status(), "extra");
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 200; ++i) deep = nlohmann::json::array({deep});
  EXPECT_ERROR_HAS(tmpl->Render(deep, {}).status(), "nested too deeply");
}

TEST(ChatTemplateTest, RunawayTemplatesHitLimits) {
  // Infinite recursion, huge loops and huge outputs end in errors, never hangs or crashes.
  EXPECT_ERROR_HAS(RenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
                   "macro recursion");
  EXPECT_ERROR_HAS(RenderError("{% for i in range(100000000) %}{% endfor %}"), "steps");
  EXPECT_ERROR_HAS(
      RenderError("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
                  "{% endfor %}{% endfor %}{% endfor %}"),
      "steps");
  EXPECT_ERROR_HAS(RenderError("{{ 'x' * 100000000000 }}"), "bytes");
  EXPECT_ERROR_HAS(RenderError("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}"),
                   "bytes");
  EXPECT_ERROR_HAS(RenderError("{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
                               "{% set ns.s = ns.s + ns.s %}{% endfor %}"),
                   "bytes");
  // Deep nesting in the source is a syntax error, not a stack overflow.
  std::string parens = std::string(100000, '(') + "1" + std::string(100000, ')');
  EXPECT_ERROR_HAS(ChatTemplate::Parse("{{ " + parens + " }}").status(), "nested too deeply");
  EXPECT_ERROR_HAS(ChatTemplate::Parse("{{ " + std::string(100000, '[') + " }}").status(),
                   "unterminated");
  std::string nots;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_ERROR_HAS(ChatTemplate::Parse("{{ " + nots + "x }}").status(), "nested too deeply");
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_ERROR_HAS(ChatTemplate::Parse(chain + " }}").status(), "nested too deeply");
  std::string attrs = "{{ x", filters = "{{ x";
  for (int i = 0; i < 100000; ++i) {
    attrs += ".y";
    filters += " | trim";
  }
  EXPECT_ERROR_HAS(ChatTemplate::Parse(attrs + " }}").status(), "nested too deeply");
  EXPECT_ERROR_HAS(ChatTemplate::Parse(filters + " }}").status(), "nested too deeply");
  // Values a template nests at run time are bounded too; a namespace holding itself is fine.
  EXPECT_ERROR_HAS(RenderError("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}"
                               "{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}"),
                   "nested deeper");
  EXPECT_EQ(RenderOk("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me }}"),
            "<Namespace>");
  EXPECT_ERROR_HAS(RenderError("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}"),
                   "not JSON serializable");
  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if x %}";
  EXPECT_ERROR_HAS(ChatTemplate::Parse(ifs).status(), "nested too deeply");
}

}  // namespace
}  // namespace pdserve
