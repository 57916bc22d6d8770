// The request and response an HttpServer handler sees and gives (plain data, no Beast types), so
// that the API layers above it need no Boost headers.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tripod::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // as sent, e.g. "/v1/completions?x=1"
  std::string path;    // the target without the query, e.g. "/v1/completions"
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in order
  std::string body;  // decoded (chunked request bodies are joined)
  std::string peer;  // the client: "127.0.0.1:5555" or "[::1]:5555"
  int version = 11;  // 10 or 11

  // The first header of that name (given lower-case); nullptr if absent.
  const std::string* Header(std::string_view lower_name) const {
    for (const auto& [name, value] : headers) {
      if (name == lower_name) return &value;
    }
    return nullptr;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";  // empty: no Content-Type header
  // Extra headers (Retry-After, Allow, ...). Content-Length, Transfer-Encoding and Server are the
  // server's own and ignored here; "Connection: close" closes the connection after the response.
  // A name or value with CR, LF or NUL is dropped (no header injection).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

}  // namespace tripod::http
