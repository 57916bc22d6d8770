// FaultInjectingStream; see fault_injecting_stream.h.
#include "common/kv_transfer/fault_injecting_stream.h"

#include <chrono>
#include <thread>

namespace tripod {

bool FaultInjectingStream::Write(const v1::KvChunk& chunk) {
  switch (faults_.Draw()) {
    case ChunkFault::kDrop:
      return true;  // numbered but never written: the decode side sees the gap
    case ChunkFault::kCorrupt: {
      v1::KvChunk bad = chunk;
      faults_.Corrupt(bad.mutable_payload());
      return inner_->Write(bad);
    }
    case ChunkFault::kDelay:
      std::this_thread::sleep_for(std::chrono::milliseconds(faults_.rates().delay_ms));
      break;
    default:
      break;
  }
  return inner_->Write(chunk);
}

}  // namespace tripod
