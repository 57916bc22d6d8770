// tripod serve's target and draft models; see serve_models.h.
#include "cli/serve_models.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/gguf.h"
#include "common/model/model_catalogue.h"
#include "common/model/model_config.h"
#include "common/model/model_resolver.h"
#include "common/model/vocabulary_match.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

ABSL_DECLARE_FLAG(int, draft_layers);              // cli/draft.cc
ABSL_DECLARE_FLAG(std::string, lookahead_layers);  // cli/draft.cc

namespace tripod {
namespace {

// Runs `script name` with its output on our stderr (stdout stays the URL's), waiting for it.
absl::Status RunFetchModel(const std::string& script, const std::string& name) {
  Logger("serve").info("tripod serve: fetching {} ({} {})", name, script, name);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execl(script.c_str(), script.c_str(), name.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(
        absl::StrCat("scripts/fetch_model ", name, " failed (its messages are above)"));
  }
  return absl::OkStatus();
}

// ResolveModel, fetching a missing catalogue model first when `fetch`; the path made absolute, as
// the children are given it.
absl::StatusOr<std::string> ResolveForServe(const std::string& name_or_path, bool fetch) {
  absl::StatusOr<std::string> path = ResolveModel(name_or_path);
  if (!path.ok() && absl::IsNotFound(path.status()) && fetch) {
    const std::string script = FetchModelScript();
    if (script.empty()) {
      return absl::NotFoundError(absl::StrCat(path.status().message(),
                                              " (--fetch: no scripts/fetch_model found above "
                                              "this binary or in its source tree)"));
    }
    const std::string name =
        name_or_path.empty() ? BuiltinModelCatalogue().default_model : name_or_path;
    RETURN_IF_ERROR(RunFetchModel(script, name));
    path = ResolveModel(name_or_path);
  }
  if (!path.ok()) return path.status();
  if (access(path->c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("model ", *path,
                                            " not found (run scripts/setup, or "
                                            "give --model a catalogue name or a GGUF file)"));
  }
  if (char* abs = realpath(path->c_str(), nullptr)) {
    *path = abs;
    std::free(abs);
  }
  // An architecture Tripod does not serve (or a file that is no GGUF) stops serve here, with the
  // reason, rather than every worker in turn.
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(*path);
  absl::Status config = gguf.ok() ? ReadModelConfig(**gguf).status() : gguf.status();
  if (!config.ok()) {
    return absl::Status(config.code(), absl::StrCat(*path, ": ", config.message()));
  }
  return path;
}

}  // namespace

absl::StatusOr<ServeModels> ChooseServeModels(const std::string& model_flag,
                                              const std::string& draft_flag, bool with_draft,
                                              bool fetch) {
  ServeModels m;
  ASSIGN_OR_RETURN(m.target, ResolveForServe(model_flag, fetch));
  if (!with_draft) return m;
  m.draft_name = DraftModelFor(BuiltinModelCatalogue(), model_flag, draft_flag);
  if (m.draft_name.empty()) return m;  // a self-draft
  const char* why = draft_flag.empty() ? " (the catalogue's draft of the model)" : "";
  if (absl::GetFlag(FLAGS_draft_layers) > 0 || absl::GetFlag(FLAGS_lookahead_layers) != "all") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--draft_layers and --lookahead_layers shape a self-draft, but the draft workers run ",
        m.draft_name, why, ", which runs in full; give --draft_model=self for a self-draft"));
  }
  absl::StatusOr<std::string> draft = ResolveForServe(m.draft_name, fetch);
  if (!draft.ok()) {
    return absl::Status(draft.status().code(),
                        absl::StrCat("draft model", why, ": ", draft.status().message(),
                                     " (or give --draft_model=self for a self-draft, or "
                                     "--draft_workers=0 for none)"));
  }
  m.draft = *draft;
  RETURN_IF_ERROR(CheckSameVocabulary(m.draft, m.target));
  return m;
}

}  // namespace tripod
