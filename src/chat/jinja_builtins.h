// Built-in filters, tests, global functions and str/dict methods of the chat-template
// interpreter (the subset used by Hugging Face chat templates). Stateless; each call uses only
// the Evaluator it is given (one render, one thread).
//
// strftime_now(fmt) formats the Evaluator's clock (ChatRenderOptions::now_unix_seconds, else
// the system clock) in UTC with the C locale ("%d %b %Y" -> "26 Jul 2024").
#pragma once

#include <string>

#include "chat/jinja_eval.h"
#include "chat/jinja_value.h"
#include "common/status.h"

namespace pdserve::jinja {

Result<Value> ApplyFilter(Evaluator& ev, const std::string& name, const Value& value,
                          const CallArgs& args);
Result<bool> ApplyTest(Evaluator& ev, const std::string& name, const Value& value,
                       const CallArgs& args);
// True if `name` is a global function (raise_exception, strftime_now, namespace, range, dict).
bool IsGlobalFunction(const std::string& name);
Result<Value> CallGlobal(Evaluator& ev, const std::string& name, const CallArgs& args);
// True if values of self's type have a method `name` (e.g. str.startswith, dict.items).
bool HasMethod(const Value& self, const std::string& name);
Result<Value> CallMethod(Evaluator& ev, const Value& self, const std::string& name,
                         const CallArgs& args);

}  // namespace pdserve::jinja
