// TensorBoard event files: CRC-32C against the standard check values, the TFRecord framing read back, and the
// hand-encoded Event messages decoded by protoc against TensorBoard's field numbers
// (tests/fixtures/tensorboard/event.proto).
#include "train/tensorboard_log.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "../io/io_test_util.h"
#include "core/error.h"
#include "tensorboard_test_util.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

TEST(TensorBoardLog, Crc32cStandardVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(TensorBoardLog, FrameIsLengthCrcPayloadCrc) {
  const std::string frame = tfrecord_frame("hello");
  ASSERT_EQ(frame.size(), 8u + 4 + 5 + 4);
  EXPECT_EQ(frame.substr(0, 8), std::string("\x05\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(frame.substr(12, 5), "hello");
  io_test::ScratchDir dir;
  std::ofstream(dir.file("records"), std::ios::binary) << frame << tfrecord_frame("");
  const auto records = test::tfrecords_read(dir.file("records"));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0], "hello");
  EXPECT_EQ(records[1], "");
}

// Exact protoc text: every field number, wire type and value as TensorBoard's event.proto reads them.
TEST(TensorBoardLog, ProtocDecodesTheEvents) {
  EXPECT_EQ(test::protoc_decode_event(tensorboard_event_file_version(1234.5)),
            "wall_time: 1234.5\nfile_version: \"brain.Event:2\"\n");
  EXPECT_EQ(test::protoc_decode_event(tensorboard_event_session_start(1234.5, 12)),
            "wall_time: 1234.5\nstep: 12\nsession_log {\n  status: START\n}\n");
  EXPECT_EQ(test::protoc_decode_event(tensorboard_event_scalars(
                1700000000.25, int64_t{1} << 40, {{"train/loss", 2.5f}, {"eval/loss", -0.125f}})),
            "wall_time: 1700000000.25\nstep: 1099511627776\nsummary {\n"
            "  value {\n    tag: \"train/loss\"\n    simple_value: 2.5\n  }\n"
            "  value {\n    tag: \"eval/loss\"\n    simple_value: -0.125\n  }\n}\n");
}

TEST(TensorBoardLog, MetricsRecordScalars) {
  nlohmann::ordered_json rec;
  rec["step"] = 3;
  rec["loss"] = 2.5;
  rec["ce_loss"] = nullptr;  // non-finite
  rec["grad_norm"] = 0.5;
  rec["tokens"] = 12;
  rec["skipped"] = true;
  rec["eval_loss"] = 1.25;
  rec["eval_tokens"] = 4;
  const auto got = tensorboard_scalars_of_metrics(rec);
  const std::vector<std::pair<std::string, float>> want = {
      {"train/loss", 2.5f}, {"train/grad_norm", 0.5f}, {"train/tokens", 12.0f}, {"eval/loss", 1.25f},
      {"eval/tokens", 4.0f}};
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tag, want[i].first);
    EXPECT_EQ(got[i].value, want[i].second) << got[i].tag;
  }
}

// Each step's record is on disk when scalars() returns (a crash keeps it), in a file named as TensorBoard's
// writers name theirs.
TEST(TensorBoardLog, WritesReadableRecordsAsItGoes) {
  io_test::ScratchDir dir;
  TensorBoardLog log(dir.file("tb"), 1, false);
  log.scalars(1, {{"train/loss", 3.0f}});
  log.scalars(2, {{"train/loss", 2.0f}, {"train/lr", 0.001f}});
  const auto files = test::event_files(dir.path / "tb");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].string(), log.path());
  EXPECT_EQ(files[0].filename().string().rfind("events.out.tfevents.", 0), 0u) << files[0];
  const auto records = test::tfrecords_read(files[0]);
  ASSERT_EQ(records.size(), 4u);
  const test::DecodedEvent version = test::event_decode(records[0]), start = test::event_decode(records[1]);
  EXPECT_EQ(version.file_version, "brain.Event:2");
  EXPECT_TRUE(start.session_start);
  EXPECT_EQ(start.step, 1);
  const test::DecodedEvent second = test::event_decode(records[3]);
  EXPECT_EQ(second.step, 2);
  const std::vector<std::pair<std::string, float>> want = {{"train/loss", 2.0f}, {"train/lr", 0.001f}};
  EXPECT_EQ(second.values, want);
}

// A resume's file sorts after the earlier ones even when started within the same second (TensorBoard reads by
// name); a new run removes the earlier run's files.
TEST(TensorBoardLog, AResumeSortsLastAndANewRunStartsOver) {
  io_test::ScratchDir dir;
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  const fs::path tb = dir.path / "tb";
  fs::create_directories(tb);
  const fs::path earlier = tb / ("events.out.tfevents." + std::to_string(now + 100) + ".elsewhere");
  std::ofstream(earlier) << "x";
  std::ofstream(tb / "notes.txt") << "kept";
  std::string resumed;
  {
    TensorBoardLog log(tb.string(), 5, true);
    resumed = fs::path(log.path()).filename().string();
  }
  EXPECT_EQ(resumed.rfind("events.out.tfevents." + std::to_string(now + 101) + ".", 0), 0u) << resumed;
  EXPECT_EQ(test::event_files(tb), (std::vector<fs::path>{earlier, tb / resumed, tb / "notes.txt"}));
  TensorBoardLog fresh(tb.string(), 1, false);
  EXPECT_EQ(test::event_files(tb), (std::vector<fs::path>{fs::path(fresh.path()), tb / "notes.txt"}));
}

TEST(TensorBoardLog, AnUnwritableDirectoryIsAnError) {
  io_test::ScratchDir dir;
  std::ofstream(dir.file("file")) << "x";
  EXPECT_THROW(TensorBoardLog(dir.file("file/tb"), 1, false), Error);
}

}  // namespace
}  // namespace mt
