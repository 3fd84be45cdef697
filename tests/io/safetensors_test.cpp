#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/memory.h"
#include "io_test_util.h"

namespace mt {
namespace {

using io_test::expect_error;
using io_test::ScratchDir;
using io_test::st_bytes;

Tensor bytes_tensor(const Shape& shape, DType dt, const std::vector<uint8_t>& raw) {
  Tensor t = Tensor::empty(shape, dt);
  EXPECT_EQ(t.nbytes(), raw.size());
  std::memcpy(t.data(), raw.data(), raw.size());
  return t;
}

std::string tensor_bytes(const Tensor& t) { return std::string(static_cast<const char*>(t.data()), t.nbytes()); }

TEST(Safetensors, WriterBytesExactMixedDtypes) {
  ScratchDir d;
  // Given in an order unlike the file order; the writer sorts by dtype descending, then name.
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"mask", bytes_tensor({3}, DType::U8, {0x00, 0x01, 0xff})},
      {"w", Tensor::from_floats({2}, {1.0f, -2.0f})},
      {"b", Tensor::from_floats({3}, {1.0f, -1.5f, 0.0f}, DType::BF16)},
      {"idx", bytes_tensor({1}, DType::I64, {7, 0, 0, 0, 0, 0, 0, 0})},
      {"a", Tensor::from_floats({}, {0.5f})},
  };
  safetensors_write(d.file("x.safetensors"), ts);
  const std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("idx":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[],"data_offsets":[8,12]},)"
      R"("w":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[20,26]},)"
      R"("mask":{"dtype":"U8","shape":[3],"data_offsets":[26,29]}})";
  ASSERT_EQ(header.size(), 308u);
  const std::string data = std::string("\x07\0\0\0\0\0\0\0", 8)       // idx = 7
                           + std::string("\0\0\0\x3f", 4)               // a = 0.5
                           + std::string("\0\0\x80\x3f\0\0\0\xc0", 8)   // w = 1, -2
                           + std::string("\x80\x3f\xc0\xbf\0\0", 6)     // b = 1, -1.5, 0 (bf16)
                           + std::string("\x00\x01\xff", 3);            // mask
  const std::string expected = std::string("\x38\x01\0\0\0\0\0\0", 8) + header + "    " + data;
  EXPECT_EQ(io_test::read_bytes(d.file("x.safetensors")), expected);
  // No temp file is left next to it.
  auto it = std::filesystem::directory_iterator(d.path);
  EXPECT_EQ(std::distance(begin(it), end(it)), 1);
}

TEST(Safetensors, WriterEscapesNamesLikeSerdeAndOmitsEmptyMetadata) {
  ScratchDir d;
  const std::string name = std::string("q\"\\\n\r\t\b\f\x01\x1f\x7f/\xc3\xa9\0", 15);  // NUL included
  safetensors_write(d.file("e.safetensors"), {{name, Tensor::from_floats({1}, {2.0f})}}, {});
  const std::string header =
      "{\"q\\\"\\\\\\n\\r\\t\\b\\f\\u0001\\u001f\x7f/\xc3\xa9\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(io_test::read_bytes(d.file("e.safetensors")), io_test::u64_le(padded.size()) + padded +
                                                                 std::string("\0\0\0\x40", 4));
  auto f = SafetensorsFile::open(d.file("e.safetensors"));
  ASSERT_TRUE(f.has(name));
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.tensor(name).to_floats(), std::vector<float>{2.0f});
}

TEST(Safetensors, RoundTripZeroCopy) {
  ScratchDir d;
  Tensor w = Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor h = Tensor::from_floats({4}, {0.25f, -8, 3.5f, 1e-3f}, DType::F16);
  Tensor e = Tensor::empty({0, 5}, DType::BF16);
  Tensor f8 = bytes_tensor({2}, DType::F8_E4M3, {0x38, 0x7e});
  safetensors_write(d.file("r.safetensors"), {{"w", w}, {"h", h}, {"empty", e}, {"f8", f8}},
                    {{"format", "pt"}, {"note", "hi"}});
  const int64_t mapped_before = memory_stats(Device::cpu()).mapped_bytes;
  {
    auto f = SafetensorsFile::open(d.file("r.safetensors"));
    const auto size = static_cast<int64_t>(std::filesystem::file_size(d.file("r.safetensors")));
    EXPECT_EQ(memory_stats(Device::cpu()).mapped_bytes, mapped_before + size);
    EXPECT_EQ(f.names(), (std::vector<std::string>{"w", "empty", "h", "f8"}));
    EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hi"}}));
    EXPECT_EQ(f.info("w").dtype, DType::F32);
    EXPECT_EQ(f.info("w").shape, (Shape{2, 3}));
    EXPECT_EQ(f.info("w").begin, 0u);
    EXPECT_EQ(f.info("w").end, 24u);
    EXPECT_EQ(f.info("h").begin, 24u);
    Tensor rw = f.tensor("w");
    EXPECT_FALSE(rw.storage()->owned());  // borrowed from the mapping
    EXPECT_EQ(tensor_bytes(rw), tensor_bytes(w));
    EXPECT_EQ(tensor_bytes(f.tensor("h")), tensor_bytes(h));
    EXPECT_EQ(f.tensor("empty").shape(), (Shape{0, 5}));
    EXPECT_EQ(f.tensor("f8").to_floats(), (std::vector<float>{1.0f, 448.0f}));
    // The mapping outlives the file object while a tensor still borrows it.
    Tensor keep = f.tensor("h");
    f = SafetensorsFile();
    EXPECT_EQ(memory_stats(Device::cpu()).mapped_bytes, mapped_before + size);
    EXPECT_EQ(keep.to_floats(), h.to_floats());
  }
  EXPECT_EQ(memory_stats(Device::cpu()).mapped_bytes, mapped_before);
}

TEST(Safetensors, WriterRejectsDuplicatesAndKeepsOldFileOnFailure) {
  ScratchDir d;
  const std::string p = d.file("dup.safetensors");
  io_test::write_bytes(p, "old");
  Tensor t = Tensor::from_floats({1}, {1});
  expect_error([&] { safetensors_write(p, {{"x", t}, {"x", t}}); }, {p, "duplicate", "\"x\""});
  expect_error([&] { safetensors_write(p, {{"__metadata__", t}}); }, {p, "__metadata__"});
  expect_error([&] { safetensors_write(p, {{"y", Tensor()}}); }, {p, "\"y\"", "undefined"});
  expect_error([&] { safetensors_write(p, {{std::string("\xff", 1), t}}); }, {p, "UTF-8"});
  EXPECT_EQ(io_test::read_bytes(p), "old");
  expect_error([&] { safetensors_write(d.file("no/such/dir/x.safetensors"), {{"x", t}}); }, {"no/such/dir"});
}

// ---- the reader rejects each kind of lie --------------------------------------------------

struct BadFile {
  ScratchDir d;
  std::string path;
  explicit BadFile(const std::string& bytes) : path(d.file("bad.safetensors")) { io_test::write_bytes(path, bytes); }
  void expect(std::initializer_list<std::string> parts) {
    std::vector<std::string> all(parts);
    all.push_back(path);
    try {
      SafetensorsFile::open(path);
      ADD_FAILURE() << "open succeeded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const auto& p : all) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos);
    }
  }
};

const std::string kEntryT = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
const std::string k8 = std::string(8, '\x11');

TEST(SafetensorsReject, ShorterThan8Bytes) { BadFile(std::string(5, '\0')).expect({"5 bytes", "shorter"}); }
TEST(SafetensorsReject, HeaderLengthOverLimit) {
  BadFile(io_test::u64_le(100'000'001) + "{}").expect({"header length 100000001", "limit"});
  BadFile(io_test::u64_le(~0ull) + "{}").expect({"limit"});
}
TEST(SafetensorsReject, HeaderPastEndOfFile) { BadFile(io_test::u64_le(64) + "{}").expect({"header length 64", "past the end"}); }
TEST(SafetensorsReject, HeaderNotUtf8) { BadFile(st_bytes("{\"\xc3\x28\":1}", "")).expect({"UTF-8", "offset 2"}); }
TEST(SafetensorsReject, HeaderNotJson) { BadFile(st_bytes("{\"t\":", "")).expect({"header", "invalid JSON"}); }
TEST(SafetensorsReject, HeaderNotObject) { BadFile(st_bytes("[1,2]", "")).expect({"JSON object", "array"}); }
TEST(SafetensorsReject, DuplicateKey) {
  BadFile(st_bytes("{" + kEntryT + "," + kEntryT + "}", k8)).expect({"duplicate", "\"t\""});
}
TEST(SafetensorsReject, EntryNotObject) { BadFile(st_bytes(R"({"t":[1]})", "")).expect({"tensor \"t\"", "object"}); }
TEST(SafetensorsReject, EntryMissingKey) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2]}})", k8)).expect({"tensor \"t\"", "missing", "data_offsets"});
}
TEST(SafetensorsReject, EntryExtraKey) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", k8))
      .expect({"tensor \"t\"", "unexpected key \"x\""});
}
TEST(SafetensorsReject, UnknownDtype) {
  BadFile(st_bytes(R"({"t":{"dtype":"F4","shape":[2],"data_offsets":[0,8]}})", k8))
      .expect({"tensor \"t\"", "unknown dtype \"F4\"", "BF16", "F8_E4M3", "U64"});
  BadFile(st_bytes(R"({"t":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", k8)).expect({"tensor \"t\"", "dtype"});
}
TEST(SafetensorsReject, ShapeNotNonNegativeIntegers) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", k8)).expect({"tensor \"t\"", "shape[0]"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", k8)).expect({"tensor \"t\"", "shape[0]"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", k8)).expect({"tensor \"t\"", "shape"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2,[1]],"data_offsets":[0,8]}})", k8)).expect({"tensor \"t\"", "shape[1]"});
}
TEST(SafetensorsReject, ShapeOverflow) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", k8))
      .expect({"tensor \"t\"", "overflows the element count"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8]}})", k8))
      .expect({"tensor \"t\"", "overflow"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})", k8))
      .expect({"tensor \"t\"", "overflows the byte count"});
}
TEST(SafetensorsReject, DataOffsetsNotTwoIntegers) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", k8)).expect({"tensor \"t\"", "data_offsets"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})", k8)).expect({"tensor \"t\"", "data_offsets"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}})", k8)).expect({"tensor \"t\"", "data_offsets"});
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":{"a":0}}})", k8)).expect({"tensor \"t\"", "data_offsets"});
}
TEST(SafetensorsReject, BeginAfterEnd) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", k8)).expect({"tensor \"t\"", "begin > end"});
}
TEST(SafetensorsReject, SizeMismatch) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", k8))
      .expect({"tensor \"t\"", "span 8 bytes, expected 12"});
}
TEST(SafetensorsReject, EndBeyondData) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", k8))
      .expect({"tensor \"t\"", "past the 8-byte data section"});
}
TEST(SafetensorsReject, Overlap) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", k8))
      .expect({"tensor \"u\"", "overlap", "\"t\""});
}
TEST(SafetensorsReject, Gap) {
  BadFile(st_bytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", k8)).expect({"tensor \"t\"", "gap", "expected begin 0"});
}
TEST(SafetensorsReject, TrailingBytes) {
  BadFile(st_bytes("{" + kEntryT + "}", k8 + "xx")).expect({"10 bytes", "cover 8", "trailing"});
}
TEST(SafetensorsReject, MetadataNotStringMap) {
  BadFile(st_bytes(R"({"__metadata__":{"format":1}})", "")).expect({"__metadata__", "\"format\"", "string"});
  BadFile(st_bytes(R"({"__metadata__":["pt"]})", "")).expect({"__metadata__", "object"});
}
TEST(SafetensorsReject, DeepNestingFailsWithoutRecursion) {
  const std::string deep = "{\"t\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  BadFile(st_bytes(deep, "")).expect({"nested deeper than"});
}
TEST(SafetensorsReject, NotARegularFile) {
  ScratchDir d;
  expect_error([&] { SafetensorsFile::open(d.path.string()); }, {d.path.string(), "not a regular file"});
  expect_error([&] { SafetensorsFile::open(d.file("missing.safetensors")); }, {"missing.safetensors"});
}
TEST(SafetensorsReject, UnknownTensorName) {
  ScratchDir d;
  safetensors_write(d.file("ok.safetensors"), {{"t", Tensor::from_floats({1}, {1})}});
  auto f = SafetensorsFile::open(d.file("ok.safetensors"));
  expect_error([&] { f.tensor("nope"); }, {d.file("ok.safetensors"), "\"nope\""});
  expect_error([&] { f.info("nope"); }, {d.file("ok.safetensors"), "\"nope\""});
}

TEST(Safetensors, ReaderAcceptsUnpaddedForeignHeaderAndSortsByOffset) {
  // A producer that lists entries out of offset order and does not pad the header.
  BadFile ok(st_bytes(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})",
                      std::string("\0\0\x80\x3f\x05\x06", 6)));
  auto f = SafetensorsFile::open(ok.path);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.tensor("b").to_floats(), (std::vector<float>{5, 6}));
  // Header length 105 is odd: "a" starts mis-aligned for F32; read it through its bytes.
  Tensor a = f.tensor("a");
  EXPECT_NE(reinterpret_cast<uintptr_t>(a.data()) % 4, 0u);
  float v;
  std::memcpy(&v, a.data(), 4);
  EXPECT_EQ(v, 1.0f);
}

}  // namespace
}  // namespace mt
