#include "scheduler/served_model.h"

#include <ctime>

#include "absl/strings/match.h"
#include "common/model/model_catalogue.h"
#include "common/model/model_resolver.h"
#include "common/util/status_macros.h"

namespace tripod::scheduler {

std::string ServedModelName(const std::string& model_flag, const std::string& served_model_name) {
  if (!served_model_name.empty()) return served_model_name;
  if (!model_flag.empty() && IsCatalogueName(BuiltinModelCatalogue(), model_flag)) {
    return model_flag;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<ServedModel>> LoadServedModel(const std::string& path,
                                                             const std::string& name,
                                                             const std::string& chat_template) {
  auto m = std::make_unique<ServedModel>();
  m->path = path;
  ASSIGN_OR_RETURN(m->identity, ComputeModelIdentity(path));
  m->max_model_len = m->identity.context_length;
  ASSIGN_OR_RETURN(m->gguf, GgufFile::Open(path));
  ASSIGN_OR_RETURN(m->tokenizer, Tokenizer::FromGguf(*m->gguf));
  std::string stem = m->identity.file_name;
  if (absl::EndsWith(stem, ".gguf")) stem.resize(stem.size() - 5);
  m->name = name.empty() ? stem : name;
  if (m->name != stem && !stem.empty()) m->aliases.push_back(stem);
  absl::StatusOr<ChatTemplate> tmpl = absl::InternalError("unset");
  if (!chat_template.empty()) {
    tmpl = ChatTemplateByName(chat_template);
    if (!tmpl.ok()) return tmpl.status();  // a flag naming an unknown template: refuse to start
  } else if (absl::StatusOr<std::string> text = m->gguf->GetString("tokenizer.chat_template");
             text.ok()) {
    tmpl = DetectChatTemplate(*text);
  } else {
    tmpl = absl::FailedPreconditionError(
        "the model has no chat template (tokenizer.chat_template); start the scheduler with "
        "--chat_template");
  }
  if (tmpl.ok()) {
    m->chat_template = *tmpl;
  } else {
    m->chat_template_error = std::string(tmpl.status().message());
  }
  m->created = static_cast<int64_t>(std::time(nullptr));
  return m;
}

}  // namespace tripod::scheduler
