#include "io/checkpoint_files.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "io_test_util.h"

namespace mt {
namespace {

using io_test::expect_error;
using io_test::read_bytes;
using io_test::ScratchDir;
using io_test::write_bytes;
namespace fs = std::filesystem;

Tensor ramp(const Shape& shape, DType dt, float start = 0) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return Tensor::from_floats(shape, v, dt);
}

std::map<std::string, std::string> one_entry(const std::string& k, const std::string& v) { return {{k, v}}; }

Tensor u8(int64_t n, uint8_t start) {
  Tensor t = Tensor::empty({n}, DType::U8);
  for (int64_t i = 0; i < n; ++i) t.data_as<uint8_t>()[i] = static_cast<uint8_t>(start + i);
  return t;
}

std::string bytes_of(const Tensor& t) { return std::string(static_cast<const char*>(t.data()), t.nbytes()); }

TEST(CheckpointWrite, GreedyShardsAndIndexBytes) {
  ScratchDir d;
  // Sizes 40, 40, 30, 200, 10 with a 100-byte limit. huggingface_hub: {a,b} fill shard 1; c
  // starts a new shard; "big" exceeds the limit and is appended at once as shard 2, before
  // the shard holding c (and d) is closed as shard 3.
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"a", ramp({10}, DType::F32)}, {"b", ramp({2, 5}, DType::F32, 10)}, {"c", u8(30, 1)},
      {"big", u8(200, 7)},           {"d", ramp({5}, DType::BF16, 3)},
  };
  auto written = checkpoint_write_tensors(d.path.string(), ts, {.max_shard_bytes = 100});
  const std::string s1 = "model-00001-of-00003.safetensors", s2 = "model-00002-of-00003.safetensors",
                    s3 = "model-00003-of-00003.safetensors";
  EXPECT_EQ(written, (std::vector<std::string>{s1, s2, s3, "model.safetensors.index.json"}));
  const std::string expected_index =
      "{\n"
      "  \"metadata\": {\n"
      "    \"total_parameters\": 255,\n"
      "    \"total_size\": 320\n"
      "  },\n"
      "  \"weight_map\": {\n"
      "    \"a\": \"model-00001-of-00003.safetensors\",\n"
      "    \"b\": \"model-00001-of-00003.safetensors\",\n"
      "    \"big\": \"model-00002-of-00003.safetensors\",\n"
      "    \"c\": \"model-00003-of-00003.safetensors\",\n"
      "    \"d\": \"model-00003-of-00003.safetensors\"\n"
      "  }\n"
      "}\n";
  EXPECT_EQ(read_bytes(d.file("model.safetensors.index.json")), expected_index);

  auto c = CheckpointFiles::open(d.path.string());
  EXPECT_EQ(c.shard_files(), (std::vector<std::string>{s1, s2, s3}));
  EXPECT_EQ(c.names(), (std::vector<std::string>{"a", "b", "big", "c", "d"}));  // index order (sorted)
  EXPECT_EQ(c.shard_of("a"), s1);
  EXPECT_EQ(c.shard_of("big"), s2);
  EXPECT_EQ(c.shard_of("d"), s3);
  EXPECT_EQ(c.index_metadata(), nlohmann::json::parse(R"({"total_parameters":255,"total_size":320})"));
  for (const auto& [name, t] : ts) {
    EXPECT_EQ(c.info(name).shape, t.shape()) << name;
    EXPECT_EQ(bytes_of(c.tensor(name)), bytes_of(t)) << name;
  }
  expect_error([&] { c.tensor("zz"); }, {d.path.string(), "\"zz\""});
  expect_error([&] { c.shard_of("zz"); }, {"\"zz\""});
}

TEST(CheckpointWrite, GreedyBoundaryExactFitStaysInShard) {
  ScratchDir d;
  // 60 + 40 == 100 fits (the rule is "> max"); the next 1-byte tensor starts shard 2.
  auto w = checkpoint_write_tensors(d.path.string(), {{"x", u8(60, 0)}, {"y", u8(40, 0)}, {"z", u8(1, 0)}},
                                    {.max_shard_bytes = 100});
  ASSERT_EQ(w.size(), 3u);
  auto c = CheckpointFiles::open(d.path.string());
  EXPECT_EQ(c.shard_of("x"), "model-00001-of-00002.safetensors");
  EXPECT_EQ(c.shard_of("y"), "model-00001-of-00002.safetensors");
  EXPECT_EQ(c.shard_of("z"), "model-00002-of-00002.safetensors");
}

TEST(CheckpointWrite, SingleShardHasNoIndex) {
  ScratchDir d;
  Tensor t = ramp({3, 2}, DType::BF16);
  auto w = checkpoint_write_tensors(d.path.string(), {{"t", t}, {"u", u8(4, 9)}});
  EXPECT_EQ(w, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(io_test::listing(d.path), (std::vector<std::string>{"model.safetensors"}));
  auto c = CheckpointFiles::open(d.path.string());
  EXPECT_EQ(c.shard_files(), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(c.names(), (std::vector<std::string>{"t", "u"}));  // file (offset) order: BF16 before U8
  EXPECT_TRUE(c.index_metadata().empty());
  EXPECT_EQ(bytes_of(c.tensor("t")), bytes_of(t));
  EXPECT_EQ(SafetensorsFile::open(d.file("model.safetensors")).metadata().at("format"), "pt");
}

TEST(CheckpointWrite, ReusesMappingAndEscapesIndexLikePython) {
  ScratchDir d;
  const std::string smile = "\xf0\x9f\x98\x80";  // U+1F600
  std::map<std::string, std::string> mapping = {
      {"x", "model-00002-of-00002.safetensors"},
      {"Z", "model-00001-of-00002.safetensors"},
      {"\xc3\xa9", "model-00001-of-00002.safetensors"},
      {"q\"\x7f" + smile, "model-00002-of-00002.safetensors"},
      {"lm_head.weight", "model-00001-of-00002.safetensors"},  // tied weight, not written: ignored
  };
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"x", u8(3, 1)}, {"Z", u8(2, 5)}, {"\xc3\xa9", ramp({2}, DType::F32)}, {"q\"\x7f" + smile, u8(1, 0)}};
  auto w = checkpoint_write_tensors(d.path.string(), ts, {.max_shard_bytes = 1, .shard_of = mapping});
  EXPECT_EQ(w, (std::vector<std::string>{"model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors",
                                         "model.safetensors.index.json"}));
  // Python sorts keys by code point: "Z" < "q..." < "x" < "\u00e9".
  const std::string expected_index =
      "{\n"
      "  \"metadata\": {\n"
      "    \"total_parameters\": 8,\n"
      "    \"total_size\": 14\n"
      "  },\n"
      "  \"weight_map\": {\n"
      "    \"Z\": \"model-00001-of-00002.safetensors\",\n"
      "    \"q\\\"\\u007f\\ud83d\\ude00\": \"model-00002-of-00002.safetensors\",\n"
      "    \"x\": \"model-00002-of-00002.safetensors\",\n"
      "    \"\\u00e9\": \"model-00001-of-00002.safetensors\"\n"
      "  }\n"
      "}\n";
  EXPECT_EQ(read_bytes(d.file("model.safetensors.index.json")), expected_index);
  auto c = CheckpointFiles::open(d.path.string());
  for (const auto& [name, t] : ts) {
    EXPECT_EQ(c.shard_of(name), mapping.at(name));
    EXPECT_EQ(bytes_of(c.tensor(name)), bytes_of(t));
  }

  // A one-shard mapping still writes the index.
  ScratchDir d2;
  checkpoint_write_tensors(d2.path.string(), {{"x", u8(1, 0)}}, {.shard_of = one_entry("x", "model-00001-of-00001.safetensors")});
  EXPECT_EQ(io_test::listing(d2.path),
            (std::vector<std::string>{"model-00001-of-00001.safetensors", "model.safetensors.index.json"}));

  // Every tensor needs an entry; entries must be plain *.safetensors names.
  expect_error([&] { checkpoint_write_tensors(d2.path.string(), {{"y", u8(1, 0)}}, {.shard_of = one_entry("x", "m.safetensors")}); },
               {d2.path.string(), "\"y\"", "no entry"});
  expect_error([&] { checkpoint_write_tensors(d2.path.string(), {{"x", u8(1, 0)}}, {.shard_of = one_entry("x", "../m.safetensors")}); },
               {"\"x\"", "../m.safetensors"});
  expect_error([&] { checkpoint_write_tensors(d2.path.string(), {{"x", u8(1, 0)}}, {.shard_of = one_entry("x", "model.safetensors.index.json")}); },
               {"\"x\"", "plain *.safetensors"});
}

TEST(CheckpointWrite, RemovesStaleShardsOnly) {
  ScratchDir d;
  std::vector<std::pair<std::string, Tensor>> ts = {{"a", u8(50, 0)}, {"b", u8(50, 1)}, {"c", u8(50, 2)}};
  checkpoint_write_tensors(d.path.string(), ts, {.max_shard_bytes = 50});
  write_bytes(d.file("config.json"), "{}");
  write_bytes(d.file("model-notes.txt"), "keep");
  write_bytes(d.file("other.safetensors"), "keep");
  EXPECT_EQ(io_test::listing(d.path).size(), 7u);
  // Re-save into two shards: shards 1..3-of-3 are stale, and the new names differ.
  checkpoint_write_tensors(d.path.string(), ts, {.max_shard_bytes = 100});
  EXPECT_EQ(io_test::listing(d.path), (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                                           "model-00002-of-00002.safetensors", "model-notes.txt",
                                                           "model.safetensors.index.json", "other.safetensors"}));
  // Re-save as one file: the index goes too.
  checkpoint_write_tensors(d.path.string(), ts);
  EXPECT_EQ(io_test::listing(d.path), (std::vector<std::string>{"config.json", "model-notes.txt", "model.safetensors",
                                                           "other.safetensors"}));
  auto c = CheckpointFiles::open(d.path.string());
  EXPECT_EQ(c.names().size(), 3u);
}

TEST(CheckpointWrite, RejectsDuplicatesAndBadLimit) {
  ScratchDir d;
  expect_error([&] { checkpoint_write_tensors(d.path.string(), {{"a", u8(1, 0)}, {"a", u8(1, 0)}}); },
               {d.path.string(), "duplicate", "\"a\""});
  expect_error([&] { checkpoint_write_tensors(d.path.string(), {{"a", u8(1, 0)}}, {.max_shard_bytes = 0}); },
               {"max shard size"});
  EXPECT_TRUE(io_test::listing(d.path).empty());
}

// ---- index validation ---------------------------------------------------------------------

struct IndexedDir {
  ScratchDir d;
  IndexedDir() {
    // shard 1: a, b; shard 2: c
    checkpoint_write_tensors(d.path.string(), {{"a", u8(4, 0)}, {"b", u8(4, 1)}, {"c", u8(4, 2)}},
                             {.max_shard_bytes = 8});
  }
  std::string index() const { return d.file("model.safetensors.index.json"); }
  void expect_index_error(const std::string& text, std::initializer_list<std::string> parts) {
    write_bytes(index(), text);
    std::vector<std::string> all(parts);
    all.push_back(index());
    try {
      CheckpointFiles::open(d.path.string());
      ADD_FAILURE() << "open succeeded for " << text;
    } catch (const Error& e) {
      for (const auto& p : all) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << p << " in " << e.what();
    }
  }
};

const std::string kS1 = "model-00001-of-00002.safetensors", kS2 = "model-00002-of-00002.safetensors";

TEST(CheckpointFilesReject, IndexErrors) {
  IndexedDir x;
  x.expect_index_error("[]", {"JSON object"});
  x.expect_index_error("{\"weight_map\": ", {"invalid JSON"});
  x.expect_index_error("{}", {"missing \"weight_map\""});
  x.expect_index_error(R"({"weight_map": []})", {"weight_map", "object"});
  x.expect_index_error(R"({"metadata": 3, "weight_map": {}})", {"\"metadata\"", "object"});
  x.expect_index_error(R"({"weight_map": {"a": 1}})", {"\"a\"", "file name"});
  x.expect_index_error(R"({"weight_map": {"a": "../x.safetensors"}})", {"\"a\"", "plain file name"});
  x.expect_index_error(R"({"weight_map": {"a": "/etc/passwd"}})", {"\"a\"", "plain file name"});
  x.expect_index_error(R"({"weight_map": {"a": ".."}})", {"\"a\"", "plain file name"});
  x.expect_index_error(R"({"weight_map": {"a": "missing.safetensors", "c": ")" + kS2 + "\"}}",
                       {"shard \"missing.safetensors\"", "missing"});
  // "c" lives in shard 2, not shard 1.
  x.expect_index_error(R"({"weight_map": {"a": ")" + kS1 + R"(", "b": ")" + kS1 + R"(", "c": ")" + kS1 + "\"}}",
                       {"tensor \"c\"", kS1, "no such tensor"});
  // Shard 1 also holds "b", which the index does not list.
  x.expect_index_error(R"({"weight_map": {"a": ")" + kS1 + R"(", "c": ")" + kS2 + "\"}}", {"shard " + kS1, "\"b\""});
  x.expect_index_error(R"({"weight_map": {"a": ")" + kS1 + R"(", "a": ")" + kS1 + "\"}}", {"duplicate", "\"a\""});
  x.expect_index_error("", {"invalid JSON"});
  // A valid hand-written index opens; names keep the index's order.
  write_bytes(x.index(), R"({"weight_map": {"c": ")" + kS2 + R"(", "b": ")" + kS1 + R"(", "a": ")" + kS1 + "\"}}");
  auto c = CheckpointFiles::open(x.d.path.string());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_TRUE(c.index_metadata().empty());
}

TEST(CheckpointFilesReject, NoModelFiles) {
  ScratchDir d;
  expect_error([&] { CheckpointFiles::open(d.path.string()); },
               {"no model.safetensors or model.safetensors.index.json in " + d.path.string()});
}

TEST(CheckpointFilesReject, BadShardNamesTheShard) {
  IndexedDir x;
  write_bytes(x.d.file(kS2), "garbage!garbage!");
  try {
    CheckpointFiles::open(x.d.path.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(x.d.file(kS2)), std::string::npos) << e.what();
  }
}

TEST(ParseSizeBytes, UnitsLikeHuggingFace) {
  EXPECT_EQ(parse_size_bytes("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_size_bytes("50GB"), 50'000'000'000);
  EXPECT_EQ(parse_size_bytes("5gb"), 5'000'000'000);
  EXPECT_EQ(parse_size_bytes("2MiB"), 2 * 1024 * 1024);
  EXPECT_EQ(parse_size_bytes("3kib"), 3072);
  EXPECT_EQ(parse_size_bytes("1TiB"), int64_t{1} << 40);
  EXPECT_EQ(parse_size_bytes("7TB"), 7'000'000'000'000);
  EXPECT_EQ(parse_size_bytes("10KB"), 10'000);
  EXPECT_EQ(parse_size_bytes("12B"), 12);
  EXPECT_EQ(parse_size_bytes("1000"), 1000);
  EXPECT_EQ(parse_size_bytes(" 4 GiB "), int64_t{4} << 30);
  for (const char* bad : {"", "GB", "5XB", "5.5GB", "-1GB", "5 G B", "99999999999999999999", "9999999999TB"})
    expect_error([&] { parse_size_bytes(bad); }, {"size \"" + std::string(bad)});
}

}  // namespace
}  // namespace mt
