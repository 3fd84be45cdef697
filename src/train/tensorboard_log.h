// TensorBoard event files (`tensorboard --logdir <run dir>`), written without TensorFlow or a protobuf
// library: TFRecord framing with masked CRC32C around hand-encoded `tensorboard.Event` messages
// (tensorboard/compat/proto/event.proto, summary.proto).
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mt {

// CRC-32C (Castagnoli), the checksum of TFRecord.
uint32_t crc32c(std::string_view bytes);

// One TFRecord: uint64 LE length, masked CRC32C of those 8 bytes, the payload, masked CRC32C of the payload.
std::string tfrecord_frame(std::string_view payload);

struct TensorBoardScalar {
  std::string tag;
  float value = 0;
};

// Serialized Event messages: the first of a file (file_version "brain.Event:2"), a SessionLog START (a restart:
// TensorBoard drops the events of earlier files at steps >= `step`) and a Summary of simple_value scalars.
std::string tensorboard_event_file_version(double wall_time);
std::string tensorboard_event_session_start(double wall_time, int64_t step);
std::string tensorboard_event_scalars(double wall_time, int64_t step, const std::vector<TensorBoardScalar>& scalars);

// The numeric fields of a metrics.jsonl record: `train/<name>`, eval_<name> as `eval/<name>`; step, nulls
// (non-finite values) and booleans are left out.
std::vector<TensorBoardScalar> tensorboard_scalars_of_metrics(const nlohmann::ordered_json& record);

class TensorBoardLog {
 public:
  // Starts a new event file in `dir` (created), named to sort after the files there (TensorBoard reads a
  // run's files in name order), with file_version and a SessionLog START at `first_step`: TensorBoard takes
  // a run's first START as its start and each later one as a restart, so every file has one. keep_earlier
  // false (a new run): the event files of an earlier run in `dir` are removed first, as metrics.jsonl is
  // started over. Failures throw mt::Error.
  TensorBoardLog(const std::string& dir, int64_t first_step, bool keep_earlier);
  // One Event with every scalar, flushed: a crash leaves whole records.
  void scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write(const std::string& event);
  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f_{nullptr, &std::fclose};
};

}  // namespace mt
