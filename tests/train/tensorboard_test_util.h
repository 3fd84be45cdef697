// Reading mixtune's TensorBoard event files back in the tests: the TFRecord framing checked record by record,
// each Event decoded by protoc against tests/fixtures/tensorboard/event.proto, so that the check does not
// share the writer's encoder.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <utility>
#include <vector>

#include "../cli/cli_process.h"  // test::slurp
#include "train/tensorboard_log.h"

namespace mt::test {

inline uint32_t tfrecord_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// The payloads of a TFRecord file; a gtest failure for a bad checksum or a torn record.
inline std::vector<std::string> tfrecords_read(const std::filesystem::path& p) {
  const std::string bytes = slurp(p);
  std::vector<std::string> out;
  for (size_t at = 0; at < bytes.size();) {
    uint64_t length = 0;
    uint32_t length_crc = 0, payload_crc = 0;
    if (bytes.size() - at < 12) {
      ADD_FAILURE() << p << ": torn record header at byte " << at;
      break;
    }
    std::memcpy(&length, bytes.data() + at, 8);
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, tfrecord_masked(crc32c(std::string_view(bytes).substr(at, 8)))) << p << " at " << at;
    if (bytes.size() - at - 12 < length + 4) {
      ADD_FAILURE() << p << ": torn record at byte " << at;
      break;
    }
    const std::string payload = bytes.substr(at + 12, length);
    std::memcpy(&payload_crc, bytes.data() + at + 12 + length, 4);
    EXPECT_EQ(payload_crc, tfrecord_masked(crc32c(payload))) << p << " at " << at;
    out.push_back(payload);
    at += 12 + length + 4;
  }
  return out;
}

// protoc's text form of one serialized tensorboard.Event.
inline std::string protoc_decode_event(const std::string& payload) {
  static std::atomic<int> n{0};
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() /
                                    ("mixtune_tb_event_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  std::ofstream(tmp, std::ios::binary) << payload;
  const std::string cmd = "protoc --proto_path=" + std::string(MIXTUNE_SOURCE_DIR) +
                          "/tests/fixtures/tensorboard --decode=tensorboard.Event event.proto < " + tmp.string() +
                          " 2>&1";
  std::string text;
  int status = -1;
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t got; (got = std::fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, got);
    status = ::pclose(p);
  }
  std::filesystem::remove(tmp);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << cmd << " failed (scripts/install-deps.sh installs protobuf-compiler): " << text;
  return text;
}

struct DecodedEvent {
  int64_t step = 0;
  std::string file_version;
  bool session_start = false;
  std::vector<std::pair<std::string, float>> values;  // summary: tag, simple_value
};

inline DecodedEvent event_decode(const std::string& payload) {
  DecodedEvent e;
  std::istringstream in(protoc_decode_event(payload));
  std::string line, tag;
  auto after = [&](const char* key) -> const char* {
    return line.rfind(key, 0) == 0 ? line.c_str() + std::strlen(key) : nullptr;
  };
  while (std::getline(in, line)) {
    line.erase(0, line.find_first_not_of(' '));
    if (const char* v = after("step: ")) e.step = std::stoll(v);
    if (const char* v = after("file_version: \"")) e.file_version = std::string(v, std::strchr(v, '"'));
    if (line == "status: START") e.session_start = true;
    if (const char* v = after("tag: \"")) tag = std::string(v, std::strchr(v, '"'));
    if (const char* v = after("simple_value: ")) e.values.emplace_back(tag, std::strtof(v, nullptr));
  }
  return e;
}

// The event files of a TensorBoard run directory in the order TensorBoard reads them (by name).
inline std::vector<std::filesystem::path> event_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

// What TensorBoard shows for `tag` (step -> value): files in name order, every SessionLog START after the
// first dropping the steps >= its own (tensorboard/backend/event_processing/plugin_event_accumulator.py).
inline std::map<int64_t, float> tensorboard_series(const std::filesystem::path& dir, const std::string& tag) {
  std::map<int64_t, float> out;
  bool started = false;
  for (const auto& file : event_files(dir))
    for (const std::string& payload : tfrecords_read(file)) {
      const DecodedEvent e = event_decode(payload);
      if (e.session_start && std::exchange(started, true)) out.erase(out.lower_bound(e.step), out.end());
      for (const auto& [t, v] : e.values)
        if (t == tag) out[e.step] = v;
    }
  return out;
}

}  // namespace mt::test
