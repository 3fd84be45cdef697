#include "train/tensorboard_log.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fs = std::filesystem;

namespace mt {

static_assert(std::endian::native == std::endian::little, "TFRecord and protobuf fixed-width fields are little-endian");

namespace {

constexpr std::array<uint32_t, 256> kCrc32cTable = [] {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0u);  // reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}();

// TFRecord stores a rotated, offset CRC: a CRC of data that holds CRCs is then not trivially related to them.
uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// Protobuf wire format: a key is (field << 3) | wire type.
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };
// Field numbers of tensorboard/compat/proto/event.proto and summary.proto.
enum Field : uint32_t {
  kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5, kEventSessionLog = 7,
  kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2, kSessionLogStatus = 1,
};
constexpr uint64_t kSessionLogStart = 1;  // SessionLog.SessionStatus.START

void put_varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out += static_cast<char>(v | 0x80);
  out += static_cast<char>(v);
}

template <typename T>
void put_raw(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_key(std::string& out, Field field, Wire wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }

void put_length_delimited(std::string& out, Field field, std::string_view bytes) {
  put_key(out, field, kLength);
  put_varint(out, bytes.size());
  out += bytes;
}

// wall_time and step, the fields every Event carries (step 0 is proto3's default and is left out).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, kEventWallTime, kFixed64);
  put_raw(e, wall_time);
  if (step != 0) {
    put_key(e, kEventStep, kVarint);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || !host[0]) return "unknown";
  return host;
}

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  uint32_t c = ~0u;
  for (unsigned char b : bytes) c = kCrc32cTable[(c ^ b) & 0xff] ^ (c >> 8);
  return ~c;
}

std::string tfrecord_frame(std::string_view payload) {
  std::string length;
  put_raw(length, static_cast<uint64_t>(payload.size()));
  std::string out = length;
  put_raw(out, masked_crc32c(length));
  out += payload;
  put_raw(out, masked_crc32c(payload));
  return out;
}

std::string tensorboard_event_file_version(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_length_delimited(e, kEventFileVersion, "brain.Event:2");
  return e;
}

std::string tensorboard_event_session_start(double wall_time, int64_t step) {
  std::string log;
  put_key(log, kSessionLogStatus, kVarint);
  put_varint(log, kSessionLogStart);
  std::string e = event_head(wall_time, step);
  put_length_delimited(e, kEventSessionLog, log);
  return e;
}

std::string tensorboard_event_scalars(double wall_time, int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  std::string summary;
  for (const TensorBoardScalar& s : scalars) {
    std::string value;
    put_length_delimited(value, kValueTag, s.tag);
    put_key(value, kValueSimpleValue, kFixed32);
    put_raw(value, s.value);
    put_length_delimited(summary, kSummaryValue, value);
  }
  std::string e = event_head(wall_time, step);
  put_length_delimited(e, kEventSummary, summary);
  return e;
}

std::vector<TensorBoardScalar> tensorboard_scalars_of_metrics(const nlohmann::ordered_json& record) {
  std::vector<TensorBoardScalar> out;
  for (const auto& [name, v] : record.items()) {
    if (name == "step" || !v.is_number() || !std::isfinite(v.get<double>())) continue;
    const bool eval = name.rfind("eval_", 0) == 0;
    out.push_back({eval ? "eval/" + name.substr(5) : "train/" + name, v.get<float>()});
  }
  return out;
}

TensorBoardLog::TensorBoardLog(const std::string& dir, int64_t first_step, bool keep_earlier) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create: {}", dir, ec.message());
  std::vector<fs::path> earlier;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    if (it->path().filename().string().rfind(kEventFilePrefix, 0) == 0) earlier.push_back(it->path());
  if (ec) fail("{}: cannot list: {}", dir, ec.message());
  // The name carries the start time in seconds; a file started within the same second as an earlier one
  // (a quick resume) takes the next second, so that name order stays start order.
  auto seconds = static_cast<int64_t>(now_seconds());
  for (const fs::path& p : earlier) {
    const std::string name = p.filename().string();
    if (keep_earlier)
      seconds = std::max<int64_t>(seconds, std::strtoll(name.c_str() + kEventFilePrefix.size(), nullptr, 10) + 1);
    else if (!fs::remove(p, ec) && ec)
      fail("{}: cannot remove: {}", p.string(), ec.message());
  }
  path_ = (fs::path(dir) / fmt::format("{}{}.{}.{}", kEventFilePrefix, seconds, host_name(), ::getpid())).string();
  f_.reset(std::fopen(path_.c_str(), "wb"));
  if (!f_) fail("{}: cannot open for writing: {}", path_, std::strerror(errno));
  const double t = now_seconds();
  write(tensorboard_event_file_version(t));
  write(tensorboard_event_session_start(t, first_step));
}

void TensorBoardLog::scalars(int64_t step, const std::vector<TensorBoardScalar>& scalars) {
  write(tensorboard_event_scalars(now_seconds(), step, scalars));
}

void TensorBoardLog::write(const std::string& event) {
  const std::string record = tfrecord_frame(event);
  if (std::fwrite(record.data(), 1, record.size(), f_.get()) != record.size() || std::fflush(f_.get()) != 0)
    fail("{}: write failed: {}", path_, write_failure_reason(path_, errno));
}

}  // namespace mt
