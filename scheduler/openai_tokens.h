// Text <-> token ids for the API: the prompt ids of a completion request (what the lifecycle
// sends to the workers), and vLLM's POST /tokenize, POST /detokenize and GET /tokenizer_info
// bodies.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/model/chat_template.h"
#include "common/model/tokenizer.h"
#include "scheduler/completion_request.h"
#include "scheduler/openai_json.h"

namespace tripod::scheduler {

// The ids the model reads for a request:
//  - text prompt: Encode with special tokens parsed (vLLM does so for completions), BOS first
//    when the tokenizer adds one;
//  - ids: as given, each checked against the vocabulary (400, param "prompt");
//  - chat: the template rendered with the generation prompt, content tokenized without special
//    tokens (a user cannot inject <|im_start|>), BOS as EncodeChat places it.
// An empty result is a 400 naming the input.
ApiResult<std::vector<int32_t>> PromptTokenIds(const CompletionRequest& request,
                                               const Tokenizer& tokenizer,
                                               const ChatTemplate& chat_template);

// POST /tokenize: {"model"?, "prompt": string | "messages": [...], "add_special_tokens",
// "add_generation_prompt"}. add_special_tokens (default true) adds BOS to a prompt as a
// completion would; with messages the ids are exactly what /v1/chat/completions feeds the model
// (the template and EncodeChat place BOS), so add_special_tokens has no effect there.
// add_generation_prompt defaults to true (as vLLM's).
struct TokenizeRequest {
  std::string model;  // empty: not given
  bool is_chat = false;
  std::string prompt;
  std::vector<ChatMessage> messages;
  std::vector<std::string> tools_json;  // as the chat template renders them (tool_calls.h)
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
};
ApiResult<TokenizeRequest> ParseTokenizeBody(std::string_view body);
// A 400 for tools, calls or tool messages the model's template cannot write.
ApiResult<std::vector<int32_t>> Tokenize(const TokenizeRequest& request, const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template);
// {"tokens": [...], "count": n, "max_model_len": m}.
std::string TokenizeResponseBody(std::span<const int32_t> tokens, int max_model_len);

// POST /detokenize: {"model"?, "tokens": [ids]}; ids outside the vocabulary are a 400 naming
// "tokens".
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
ApiResult<DetokenizeRequest> ParseDetokenizeBody(std::string_view body, int32_t vocab_size);
// {"prompt": text}; bytes that are not UTF-8 (ids that split a character) become U+FFFD.
std::string DetokenizeResponseBody(const DetokenizeRequest& request, const Tokenizer& tokenizer);

// GET /tokenizer_info (vLLM's): what a client needs to tokenize through /tokenize and
// /detokenize instead of loading the tokenizer itself (lm-evaluation-harness's remote tokenizer
// looks for it, and for "eos_token" in it, before it uses them): "tokenizer_class" (the GGUF's
// tokenizer model, "gpt2" for byte-level BPE or "llama" for SentencePiece BPE, not a Hugging Face
// class name), "bos_token" and "eos_token" (their text, null when the model has none),
// "pad_token" (null: the API never pads), "add_bos_token" (whether a text prompt gets BOS),
// "model_max_length" (null when unknown) and "vocab_size".
std::string TokenizerInfoBody(const Tokenizer& tokenizer, int64_t max_model_len);

}  // namespace tripod::scheduler
