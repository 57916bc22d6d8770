// FaultInjectingStream: with each rate at 1 a data chunk is dropped (not written, the stream goes
// on), corrupted (exactly one payload byte differs, the rest of the chunk as it was) or delayed
// (written after delay_ms); the end message always passes untouched; at rate 0 chunks pass as
// they are. Counts follow what was done.
#include "common/kv_transfer/fault_injecting_stream.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "absl/time/clock.h"

namespace tripod {
namespace {

// Records what reaches the wire.
class RecordingStream final : public KvChunkStream {
 public:
  explicit RecordingStream(std::vector<v1::KvChunk>* out) : out_(out) {}
  void Open() override {}
  bool Write(const v1::KvChunk& chunk) override {
    out_->push_back(chunk);
    return true;
  }
  void WriteLast(const v1::KvChunk& end) override { out_->push_back(end); }
  absl::StatusOr<v1::PushKvResponse> Finish() override { return v1::PushKvResponse(); }
  void Cancel() override {}

 private:
  std::vector<v1::KvChunk>* out_;
};

v1::KvChunk DataChunk(uint32_t seq) {
  v1::KvChunk c;
  c.set_transfer_id(3);
  c.set_seq(seq);
  c.set_payload(std::string(100, '\x11'));
  return c;
}

v1::KvChunk EndChunk(uint32_t seq) {
  v1::KvChunk c;
  c.set_transfer_id(3);
  c.set_seq(seq);
  c.set_end(true);
  return c;
}

TEST(FaultInjectingStreamTest, DropLeavesAGapAndTheEndPasses) {
  std::vector<v1::KvChunk> wire;
  TransferFaultRates r;
  r.drop = 1;
  TransferFaultInjector faults(r);
  FaultInjectingStream s(std::make_unique<RecordingStream>(&wire), faults);
  EXPECT_TRUE(s.Write(DataChunk(0))) << "a dropped chunk does not end the stream";
  EXPECT_TRUE(s.Write(DataChunk(1)));
  s.WriteLast(EndChunk(2));
  ASSERT_EQ(wire.size(), 1u);
  EXPECT_TRUE(wire[0].end());
  EXPECT_EQ(wire[0].seq(), 2u);
  EXPECT_EQ(faults.count(ChunkFault::kDrop), 2u);
}

TEST(FaultInjectingStreamTest, CorruptFlipsOneByteOfThePayload) {
  std::vector<v1::KvChunk> wire;
  TransferFaultRates r;
  r.corrupt = 1;
  TransferFaultInjector faults(r);
  FaultInjectingStream s(std::make_unique<RecordingStream>(&wire), faults);
  const v1::KvChunk sent = DataChunk(0);
  EXPECT_TRUE(s.Write(sent));
  ASSERT_EQ(wire.size(), 1u);
  EXPECT_EQ(wire[0].seq(), 0u);
  ASSERT_EQ(wire[0].payload().size(), sent.payload().size());
  int differ = 0;
  for (size_t i = 0; i < sent.payload().size(); ++i)
    differ += wire[0].payload()[i] != sent.payload()[i];
  EXPECT_EQ(differ, 1);
  EXPECT_EQ(faults.count(ChunkFault::kCorrupt), 1u);
}

TEST(FaultInjectingStreamTest, DelayHoldsTheWrite) {
  std::vector<v1::KvChunk> wire;
  TransferFaultRates r;
  r.delay = 1;
  r.delay_ms = 60;
  TransferFaultInjector faults(r);
  FaultInjectingStream s(std::make_unique<RecordingStream>(&wire), faults);
  const absl::Time t0 = absl::Now();
  EXPECT_TRUE(s.Write(DataChunk(0)));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(60));
  ASSERT_EQ(wire.size(), 1u);
  EXPECT_EQ(wire[0].payload(), DataChunk(0).payload());
  EXPECT_EQ(faults.count(ChunkFault::kDelay), 1u);
}

TEST(FaultInjectingStreamTest, NoRatesNoFaults) {
  std::vector<v1::KvChunk> wire;
  TransferFaultInjector faults(TransferFaultRates{});
  FaultInjectingStream s(std::make_unique<RecordingStream>(&wire), faults);
  for (uint32_t i = 0; i < 50; ++i) EXPECT_TRUE(s.Write(DataChunk(i)));
  ASSERT_EQ(wire.size(), 50u);
  for (uint32_t i = 0; i < 50; ++i)
    EXPECT_EQ(wire[i].SerializeAsString(), DataChunk(i).SerializeAsString());
  EXPECT_EQ(faults.count(ChunkFault::kNone), 50u);
}

}  // namespace
}  // namespace tripod
