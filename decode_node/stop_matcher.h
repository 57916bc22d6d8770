// Stop strings on streamed text: text is released only once no stop string can still begin in
// it, so no part of a stop string is ever streamed; the text before the first match is (and the
// matched stop string too with include_stop, vLLM's include_stop_str_in_output).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tripod {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops, bool include_stop = false);

  struct Result {
    std::string text;      // newly final text
    bool stopped = false;  // a stop string matched; text ends just before it (include_stop:
                           // just after it)
  };
  // Appends decoded text. After a stop, further pushes return nothing.
  Result Push(std::string_view piece);
  // The text still held back (at the end of the stream, when no stop string matched).
  std::string Flush();
  bool stopped() const { return stopped_; }
  bool holding() const { return !held_.empty(); }  // text held back, not yet released

 private:
  std::vector<std::string> stops_;  // non-empty strings only
  bool include_stop_ = false;
  std::string held_;  // decoded text not yet released
  bool stopped_ = false;
};

}  // namespace tripod
