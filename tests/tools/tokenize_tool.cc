// Test driver for tests/reference/test_tokenizer.py: encodes, decodes and renders chats with
// Tripod's tokenizer, reading and writing JSON files so Python can compare with references.
//   tokenize_tool encode <model.gguf> <in.json> <out.json>   in: {"texts": [...], "parse_special"}
//   tokenize_tool decode <model.gguf> <in.json> <out.json>   in: {"ids": [[...], ...]}
//   tokenize_tool chat <in.json> <out.json>   in: {"template", "name" or "model", "messages",
//       "add_generation_prompt"}; with "model" (a GGUF path) the template is the file's own
//       tokenizer.chat_template, and "ids" (EncodeChat, content not parsed for special tokens,
//       as the scheduler does) are written beside "text"
//   tokenize_tool info <model.gguf>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/model/chat_template.h"
#include "common/model/gguf.h"
#include "common/model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using tripod::Tokenizer;

std::string Hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

bool ReadJson(const std::string& path, json* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "cannot read " << path << "\n";
    return false;
  }
  try {
    *out = json::parse(in);
  } catch (const std::exception& e) {
    std::cerr << "bad JSON in " << path << ": " << e.what() << "\n";
    return false;
  }
  return true;
}

bool WriteJson(const std::string& path, const json& j) {
  std::ofstream out(path, std::ios::binary);
  out << j.dump(-1, ' ', false, json::error_handler_t::replace);
  return static_cast<bool>(out);
}

std::unique_ptr<Tokenizer> Load(const std::string& path, std::unique_ptr<tripod::GgufFile>* gguf) {
  auto file = tripod::GgufFile::Open(path);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return nullptr;
  }
  auto tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) {
    std::cerr << tok.status() << "\n";
    return nullptr;
  }
  *gguf = *std::move(file);
  return *std::move(tok);
}

// Streams ids through StreamingDecoder; false when a piece broke UTF-8 that the whole decode
// keeps, or when the concatenation differs from Decode.
bool StreamMatches(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& whole,
                   std::string* streamed) {
  tripod::StreamingDecoder dec(tok);
  for (int32_t id : ids) *streamed += dec.Push(id);
  *streamed += dec.Flush();
  return *streamed == whole;
}

int Encode(const Tokenizer& tok, const json& in, json* out) {
  const bool parse_special = in.value("parse_special", true);
  std::vector<std::string> texts = in.at("texts").get<std::vector<std::string>>();
  std::vector<std::vector<int32_t>> all(texts.size());
  size_t bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < texts.size(); ++i) {
    all[i] = tok.Encode(texts[i], parse_special);
    bytes += texts[i].size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json roundtrip = json::array(), stream = json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string decoded = tok.Decode(all[i]);
    roundtrip.push_back(decoded == texts[i]);
    std::string streamed;
    stream.push_back(StreamMatches(tok, all[i], decoded, &streamed));
  }
  (*out)["ids"] = all;
  (*out)["roundtrip_ok"] = roundtrip;
  (*out)["stream_ok"] = stream;
  (*out)["encode_seconds"] = seconds;
  (*out)["bytes"] = bytes;
  return 0;
}

int Decode(const Tokenizer& tok, const json& in, json* out) {
  json hex = json::array(), stream_ok = json::array(), chunks = json::array();
  for (const auto& ids_json : in.at("ids")) {
    const auto ids = ids_json.get<std::vector<int32_t>>();
    const std::string whole = tok.Decode(ids);
    hex.push_back(Hex(whole));
    // Every Push must hand out only complete UTF-8 (unless the ids themselves are ill-formed).
    tripod::StreamingDecoder dec(tok);
    json pieces = json::array();
    std::string streamed;
    for (int32_t id : ids) {
      std::string p = dec.Push(id);
      pieces.push_back(Hex(p));
      streamed += p;
    }
    std::string rest = dec.Flush();
    pieces.push_back(Hex(rest));
    streamed += rest;
    stream_ok.push_back(streamed == whole);
    chunks.push_back(pieces);
  }
  (*out)["hex"] = hex;
  (*out)["stream_ok"] = stream_ok;
  (*out)["stream_chunks_hex"] = chunks;
  return 0;
}

int Chat(const json& in, json* out) {
  std::unique_ptr<tripod::GgufFile> gguf;
  std::unique_ptr<Tokenizer> tok;
  absl::StatusOr<tripod::ChatTemplate> tmpl = absl::InternalError("unset");
  if (in.contains("model")) {
    tok = Load(in["model"].get<std::string>(), &gguf);
    if (!tok) return 1;
    absl::StatusOr<std::string> text = gguf->GetString("tokenizer.chat_template");
    tmpl = text.ok() ? tripod::DetectChatTemplate(*text) : text.status();
  } else if (in.contains("template")) {
    tmpl = tripod::DetectChatTemplate(in["template"].get<std::string>());
  } else {
    tmpl = tripod::ChatTemplateByName(in.value("name", ""));
  }
  if (!tmpl.ok()) {
    (*out)["error"] = tmpl.status().ToString();
    return 0;
  }
  std::vector<tripod::ChatMessage> messages;
  for (const auto& m : in.at("messages")) {
    messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  const bool add_generation_prompt = in.value("add_generation_prompt", false);
  (*out)["text"] = tripod::RenderChat(*tmpl, messages, add_generation_prompt);
  if (tok != nullptr) {
    const std::vector<tripod::ChatSegment> segments =
        tripod::RenderChatSegments(*tmpl, messages, add_generation_prompt);
    (*out)["ids"] = tripod::EncodeChat(*tok, segments, /*parse_special_in_content=*/false);
  }
  (*out)["default_system"] = tmpl->default_system;
  (*out)["kind"] = tmpl->kind == tripod::ChatTemplateKind::kChatML ? "chatml" : "llama3";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: tokenize_tool encode|decode|chat|info ...\n";
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "info" && argc == 3) {
    std::unique_ptr<tripod::GgufFile> gguf;
    auto tok = Load(argv[2], &gguf);
    if (!tok) return 1;
    json j = {{"vocab_size", tok->vocab_size()},
              {"bos", tok->bos_id()},
              {"eos", tok->eos_id()},
              {"add_bos", tok->add_bos()}};
    std::cout << j.dump() << "\n";
    return 0;
  }
  if (cmd == "chat" && argc == 4) {
    json in, out;
    if (!ReadJson(argv[2], &in)) return 1;
    try {
      if (Chat(in, &out) != 0) return 1;
    } catch (const std::exception& e) {
      std::cerr << "bad request: " << e.what() << "\n";
      return 1;
    }
    return WriteJson(argv[3], out) ? 0 : 1;
  }
  if ((cmd == "encode" || cmd == "decode") && argc == 5) {
    std::unique_ptr<tripod::GgufFile> gguf;
    auto tok = Load(argv[2], &gguf);
    if (!tok) return 1;
    json in, out;
    if (!ReadJson(argv[3], &in)) return 1;
    try {
      if (cmd == "encode") {
        Encode(*tok, in, &out);
      } else {
        Decode(*tok, in, &out);
      }
    } catch (const std::exception& e) {
      std::cerr << "bad request: " << e.what() << "\n";
      return 1;
    }
    return WriteJson(argv[4], out) ? 0 : 1;
  }
  std::cerr << "usage: tokenize_tool encode|decode <model.gguf> <in.json> <out.json> | "
               "chat <in.json> <out.json> | info <model.gguf>\n";
  return 2;
}
