// libFuzzer target for the text path every request takes: the tokenizer of the bundled model on
// arbitrary bytes (with and without special tokens), decoding arbitrary ids whole and streamed,
// and the chat templates on arbitrary messages and template texts. Promises checked: no crash
// or sanitizer report; every id Encode returns is in the vocabulary; valid UTF-8 text without
// special tokens decodes back to itself (when the vocabulary has all its bytes); the streamed
// pieces concatenate to Decode's text; the rendered chat equals its segments' concatenation.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/model/chat_template.h"
#include "common/model/gguf.h"
#include "common/model/tokenizer.h"
#include "common/model/utf8.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

std::unique_ptr<tripod::GgufFile> gguf;
std::unique_ptr<tripod::Tokenizer> tokenizer;
// Bytes the vocabulary can spell: SmolLM2's lacks a few control bytes (4, 6, 19, 20, 22, 29),
// which it drops from text as Hugging Face's tokenizer of the same vocabulary does.
bool spellable[256];

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("TRIPOD_MODEL");
  const std::string path =
      env != nullptr ? env : TRIPOD_ROOT_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  auto file = tripod::GgufFile::Open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "text_fuzz: %s (set TRIPOD_MODEL)\n", file.status().ToString().c_str());
    std::abort();
  }
  gguf = std::move(*file);
  auto tok = tripod::Tokenizer::FromGguf(*gguf);
  Check(tok.ok());
  tokenizer = std::move(*tok);
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    spellable[b] = tokenizer->Decode(tokenizer->Encode(one, false)) == one;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tripod;
  FuzzedDataProvider in(data, size);
  const int mode = in.ConsumeIntegralInRange<int>(0, 2);
  const int32_t vocab = tokenizer->vocab_size();
  if (mode == 0) {
    const std::string text = in.ConsumeRemainingBytesAsString();
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = tokenizer->Encode(text, special);
      for (int32_t id : ids) Check(id >= 0 && id < vocab);
      const std::string back = tokenizer->Decode(ids);
      bool spelled = ToValidUtf8(text) == text;
      for (unsigned char c : text) spelled = spelled && spellable[c];
      if (!special && spelled) Check(back == text);
    }
  } else if (mode == 1) {
    std::vector<int32_t> ids;
    while (in.remaining_bytes() >= 2)
      ids.push_back(in.ConsumeIntegralInRange<int32_t>(-2, vocab + 2));
    const std::string whole = tokenizer->Decode(ids);
    StreamingDecoder stream(*tokenizer);
    std::string pieces;
    for (int32_t id : ids) pieces += stream.Push(id);
    pieces += stream.Flush();
    Check(pieces == whole);
  } else {
    const bool llama = in.ConsumeBool();
    auto tmpl = ChatTemplateByName(llama ? "llama3" : "chatml");
    Check(tmpl.ok());
    if (in.ConsumeBool()) {
      // An arbitrary template text: recognised or refused, never a crash.
      auto detected = DetectChatTemplate(in.ConsumeRandomLengthString(512));
      if (detected.ok()) tmpl = *detected;
    }
    std::vector<ChatMessage> messages;
    const int n = in.ConsumeIntegralInRange<int>(0, 6);
    for (int i = 0; i < n; ++i) {
      ChatMessage m;
      m.role = in.ConsumeRandomLengthString(16);
      m.content = in.ConsumeRandomLengthString(256);
      messages.push_back(std::move(m));
    }
    const bool generation_prompt = in.ConsumeBool();
    const std::string text = RenderChat(*tmpl, messages, generation_prompt);
    const std::vector<ChatSegment> segments =
        RenderChatSegments(*tmpl, messages, generation_prompt);
    std::string joined;
    for (const ChatSegment& s : segments) joined += s.text;
    Check(joined == text);
    for (int32_t id : EncodeChat(*tokenizer, segments, in.ConsumeBool())) {
      Check(id >= 0 && id < vocab);
    }
  }
  return 0;
}
