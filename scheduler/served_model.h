// The model the scheduler serves, as far as the scheduler needs it: the tokenizer and chat
// template (it tokenizes every request), the context length (it refuses prompts that cannot
// fit) and the identity digest every worker must report. No weights are loaded: the GGUF's
// metadata is read and the tensor data never touched.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/chat_template.h"
#include "common/model/gguf.h"
#include "common/model/tokenizer.h"
#include "common/rpc/model_identity.h"

namespace tripod::scheduler {

struct ServedModel {
  std::string name;  // what clients put in `model` (and /v1/models lists)
  // Other names `model` may give: the file name without ".gguf" when `name` is another (a
  // catalogue name, --served_model_name), so that the file's own name keeps working.
  std::vector<std::string> aliases;
  std::string path;
  ModelIdentityInfo identity;
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;  // absent: chat requests get a 400 saying why
  std::string chat_template_error;
  int64_t created = 0;  // unix seconds, for /v1/models
  // Prompt plus completion tokens a request may use: the model's context length, or less
  // (--max_model_len); 0: unknown (no limit).
  int64_t max_model_len = 0;
};

// The name the API serves the model under: --served_model_name when given, else the catalogue
// name --model gave (`tripod-scheduler --model qwen2.5-coder-1.5b-instruct` serves
// "qwen2.5-coder-1.5b-instruct", as it was asked for), else empty (the file's name;
// LoadServedModel).
std::string ServedModelName(const std::string& model_flag, const std::string& served_model_name);

// name: empty = the file name without ".gguf" (another name keeps that one as an alias).
// chat_template: empty = the GGUF's own, or a name ("chatml", "llama3").
absl::StatusOr<std::unique_ptr<ServedModel>> LoadServedModel(const std::string& path,
                                                             const std::string& name,
                                                             const std::string& chat_template);

}  // namespace tripod::scheduler
