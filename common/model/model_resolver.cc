// --model's resolution: catalogue names to files, paths as given; see model_resolver.h.
#include "common/model/model_resolver.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);  // follows a models/ symlink
}

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Appends `dir` unless it is (the same directory as) one already there.
void AddUnique(std::vector<std::string>* dirs, const std::string& dir) {
  std::error_code ec;
  const fs::path canon = fs::weakly_canonical(dir, ec);
  const std::string key = ec ? dir : canon.string();
  for (const std::string& d : *dirs) {
    const fs::path other = fs::weakly_canonical(d, ec);
    if ((ec ? d : other.string()) == key) return;
  }
  dirs->push_back(dir);
}

bool LooksLikePath(std::string_view s) {
  return s.find('/') != std::string_view::npos || s.ends_with(".gguf");
}

}  // namespace

std::vector<std::string> CheckoutDirs() {
  std::vector<std::string> dirs;
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) AddUnique(&dirs, cwd.string());
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = 0;
    // The binary lives in build/<preset>/ or build/<preset>/bench/: up to four levels above it.
    std::string dir(exe);
    for (int up = 0; up < 4 && dir.rfind('/') != std::string::npos; ++up) {
      dir = dir.substr(0, dir.rfind('/'));
      if (!dir.empty()) AddUnique(&dirs, dir);
    }
  }
  AddUnique(&dirs, TRIPOD_SOURCE_DIR);
  return dirs;
}

ModelSearch DefaultModelSearch() {
  ModelSearch s;
  if (const std::string d = Env("TRIPOD_MODELS_DIR"); !d.empty()) s.models_dirs.push_back(d);
  for (const std::string& root : CheckoutDirs()) {
    if (const std::string d = root + "/models"; IsDir(d)) AddUnique(&s.models_dirs, d);
  }
  std::string base = Env("XDG_CACHE_HOME");
  if (base.empty() || base.front() != '/') base = Env("HOME") + "/.cache";
  s.cache_dir = base + "/tripod/models";
  return s;
}

bool IsCatalogueName(const ModelCatalogue& catalogue, std::string_view name_or_path) {
  return name_or_path.empty() || catalogue.Find(name_or_path) != nullptr;
}

absl::StatusOr<std::string> ResolveModelIn(std::string_view name_or_path,
                                           const ModelCatalogue& catalogue,
                                           const ModelSearch& search) {
  const std::string_view name =
      name_or_path.empty() ? std::string_view(catalogue.default_model) : name_or_path;
  const CatalogueModel* m = catalogue.Find(name);
  if (m == nullptr) {
    const std::string path(name_or_path);
    if (LooksLikePath(path) || IsFile(path)) return path;
    return absl::InvalidArgumentError(absl::StrCat(
        "--model '", path,
        "' is neither a file nor a model of the catalogue (a path needs a '/' or a .gguf ending); "
        "the catalogue has: ",
        absl::StrJoin(catalogue.Names(), ", ")));
  }
  std::vector<std::string> dirs = search.models_dirs;
  if (!search.cache_dir.empty()) dirs.push_back(search.cache_dir);
  for (const std::string& dir : dirs) {
    const std::string path = absl::StrCat(dir, "/", m->file);
    if (!IsFile(path)) continue;
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec || size != m->bytes) {
      // fetch_model only ever places whole files: this one was copied or cut short by hand.
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is ", ec ? std::string("unreadable") : absl::StrCat(size, " bytes"),
          ", but the catalogue's ", m->name, " is ", m->bytes,
          " bytes: remove it and fetch the model again with: scripts/fetch_model ", m->name));
    }
    return path;
  }
  return absl::NotFoundError(absl::StrCat(
      "model ", m->name, " (", m->file, ", ", m->bytes / 1000000, " MB) is not fetched (looked in ",
      absl::StrJoin(dirs, ", "), "); fetch it with: scripts/fetch_model ", m->name));
}

absl::StatusOr<std::string> ResolveModel(std::string_view name_or_path) {
  return ResolveModelIn(name_or_path, BuiltinModelCatalogue(), DefaultModelSearch());
}

std::string FetchModelScript() {
  for (const std::string& root : CheckoutDirs()) {
    const std::string script = root + "/scripts/fetch_model";
    if (access(script.c_str(), X_OK) == 0) return script;
  }
  return "";
}

}  // namespace tripod
