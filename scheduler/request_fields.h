// Every top-level field a completion body may carry, in one table (request_fields.cc): which door
// takes it, whether the parser implements it, accepts it as a no-op, or refuses it. A field the
// table does not name is refused too, so nothing a client asks for is silently ignored (an
// unimplemented vLLM `guided_choice` would otherwise give unconstrained text with a 200). To
// implement a field: turn its row into kParsed (with the values it takes) and read it in
// openai_request.cc. docs/scheduler.md lists the same rows.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "nlohmann/json.hpp"
#include "scheduler/completion_request.h"
#include "scheduler/openai_json.h"

namespace tripod::scheduler {

enum class FieldRule {
  kParsed,   // implemented: openai_request.cc reads and checks it
  kNoOp,     // accepted and changes nothing here, for the values `accepts` takes
  kRefused,  // not implemented: a 400 whatever its value
};

// Which endpoints a field belongs to.
enum FieldDoors : unsigned {
  kCompletionsDoor = 1,
  kChatDoor = 2,
  kBothDoors = 3,
};

struct RequestField {
  std::string_view name;
  unsigned doors = kBothDoors;
  FieldRule rule = FieldRule::kParsed;
  // kParsed / kNoOp: the values taken here (nullptr: any; the parser checks the type). A value it
  // does not take is refused with "'<name>' is not supported (<only>)".
  bool (*accepts)(const nlohmann::json& value) = nullptr;
  std::string_view only;  // what is taken, for the message ("only true")
};

// The table, in the order docs/scheduler.md lists it.
std::span<const RequestField> RequestFields();

// The first field of `body` (a JSON object) that this door refuses: unknown, refused, on the
// other door, or a value a no-op or a partly implemented field does not take. Null counts as
// absent. The error is OpenAI's 400 with `param` the field and a message saying it is not
// supported.
std::optional<ApiError> RefuseUnsupportedFields(const nlohmann::json& body, ApiKind kind);

}  // namespace tripod::scheduler
