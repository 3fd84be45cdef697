// Seeded mutation fuzzing of the safetensors reader and the checkpoint index parser: every
// outcome must be a successful open or an mt::Error, and a successful open must hand out
// tensors whose bytes are exactly the file's bytes at the declared offsets.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include "io/checkpoint_files.h"
#include "io_test_util.h"
#include "io/safetensors.h"

namespace mt {
namespace {

using io_test::ScratchDir;

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
  bool coin(int percent) { return below(100) < static_cast<size_t>(percent); }
};

const char* kDtypes[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
                         "I32", "U32", "F32", "F64", "I64", "U64", "F4", "C64", "bf16", ""};
const char* kNumbers[] = {"0", "1", "2", "7", "8", "-1", "1.5", "1e99", "18446744073709551615",
                          "18446744073709551616", "9223372036854775807", "4294967296", "[]", "null", "\"3\""};
const char* kNames[] = {"a", "b", "w", "__metadata__", "dtype", "shape", "data_offsets", "x\\u0000y", ""};

std::string random_json_header(Rng& r, size_t* data_len) {
  std::string h = "{";
  uint64_t offset = 0;
  const size_t n = r.below(5);
  if (r.coin(30)) h += r.coin(80) ? R"("__metadata__":{"format":"pt"})" : R"("__metadata__":{"k":1})";
  for (size_t i = 0; i < n; ++i) {
    if (h.size() > 1) h += ',';
    h += "\"" + std::string(kNames[r.below(std::size(kNames))]) + std::to_string(i) + "\":";
    if (r.coin(10)) {
      h += kNumbers[r.below(std::size(kNumbers))];
      continue;
    }
    const size_t dt = r.below(std::size(kDtypes));
    std::string shape = "[";
    uint64_t numel = 1;
    for (size_t k = 0, nd = r.below(4); k < nd; ++k) {
      const uint64_t dim = r.below(5);
      numel *= dim;
      shape += (k ? "," : "") + std::to_string(dim);
    }
    shape += "]";
    const uint64_t size = numel * (dt < 16 ? dtype_size(static_cast<DType>(dt)) : 1);
    uint64_t begin = r.coin(85) ? offset : r.below(64), end = r.coin(85) ? begin + size : r.below(64);
    offset = end;
    h += "{";
    if (!r.coin(5)) h += "\"dtype\":\"" + std::string(kDtypes[dt]) + "\",";
    if (!r.coin(5)) h += "\"shape\":" + (r.coin(5) ? std::string(kNumbers[r.below(std::size(kNumbers))]) : shape) + ",";
    if (r.coin(5)) h += "\"extra\":0,";
    h += fmt::format("\"data_offsets\":[{},{}]}}", begin, end);
  }
  h += "}";
  *data_len = r.coin(80) ? offset : r.below(128);
  return h;
}

// Rewrites one random spot of the header text, keeping the length prefix consistent.
std::string mutate_header_text(Rng& r, std::string h) {
  static const std::string kAlphabet = "{}[]\",:0123456789-.eE \\u";
  for (int edits = 1 + static_cast<int>(r.below(3)); edits > 0 && !h.empty(); --edits) {
    const size_t p = r.below(h.size());
    switch (r.below(5)) {
      case 0: h[p] = kAlphabet[r.below(kAlphabet.size())]; break;
      case 1: h.erase(p, 1 + r.below(4)); break;
      case 2: h.insert(p, 1, kAlphabet[r.below(kAlphabet.size())]); break;
      case 3: {  // replace a run of digits with another number
        size_t b = h.find_first_of("0123456789", p);
        if (b == std::string::npos) break;
        size_t e = h.find_first_not_of("0123456789", b);
        h.replace(b, (e == std::string::npos ? h.size() : e) - b, kNumbers[r.below(std::size(kNumbers))]);
        break;
      }
      default: {  // swap a dtype spelling
        size_t b = h.find("\"dtype\":\"", p);
        if (b == std::string::npos) b = h.find("\"dtype\":\"");
        if (b == std::string::npos) break;
        b += 9;
        size_t e = h.find('"', b);
        if (e != std::string::npos) h.replace(b, e - b, kDtypes[r.below(std::size(kDtypes))]);
      }
    }
  }
  return h;
}

std::string mutate_bytes(Rng& r, std::string f) {
  switch (r.below(4)) {
    case 0:  // flip bits, mostly in the header region
      for (size_t k = 0, n = 1 + r.below(4); k < n && !f.empty(); ++k) {
        size_t p = r.coin(70) ? r.below(std::min<size_t>(f.size(), 400)) : r.below(f.size());
        f[p] = static_cast<char>(f[p] ^ (1 << r.below(8)));
      }
      return f;
    case 1:  // truncate
      f.resize(r.below(f.size() + 1));
      return f;
    case 2: {  // splice a chunk of the file into another place
      if (f.empty()) return f;
      size_t a = r.below(f.size()), len = r.below(std::min<size_t>(64, f.size() - a) + 1), b = r.below(f.size());
      std::string chunk = f.substr(a, len);
      if (r.coin(50))
        f.insert(b, chunk);
      else
        f.replace(b, std::min(len, f.size() - b), chunk);
      return f;
    }
    default: {  // overwrite the header length
      uint64_t len = 0;
      for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(f[i]);
      switch (r.below(4)) {
        case 0: len += r.below(33) - 16; break;
        case 1: len = r.next(); break;
        case 2: len = f.size() - 8 + r.below(3) - 1; break;
        default: len = r.below(f.size() + 1); break;
      }
      return io_test::u64_le(len) + f.substr(8);
    }
  }
}

enum class Outcome { Opened, Rejected, Broken };

// Opens `path`; on success checks every tensor against the raw bytes. Broken (after recording
// a failure) if anything but mt::Error escaped or an accepted file was read wrongly.
Outcome open_and_check(const std::string& path, const std::string& bytes, const std::string& what) {
  try {
    auto f = SafetensorsFile::open(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    const uint64_t data_start = 8 + n;
    uint64_t covered = 0;
    for (const auto& name : f.names()) {
      const SafetensorsInfo& info = f.info(name);
      if (data_start + info.end > bytes.size()) {
        ADD_FAILURE() << what << ": tensor " << name << " ends past the file";
        return Outcome::Broken;
      }
      Tensor t = f.tensor(name);
      covered += t.nbytes();
      if (t.nbytes() != info.end - info.begin ||
          std::memcmp(t.data(), bytes.data() + data_start + info.begin, t.nbytes()) != 0) {
        ADD_FAILURE() << what << ": tensor " << name << " bytes differ from the file";
        return Outcome::Broken;
      }
      // Element reads through typed pointers need alignment; mis-aligned tensors were
      // compared bytewise above.
      if (reinterpret_cast<uintptr_t>(t.data()) % dtype_size(t.dtype()) == 0 &&
          t.to_floats().size() != static_cast<size_t>(t.numel())) {
        ADD_FAILURE() << what << ": to_floats size";
        return Outcome::Broken;
      }
    }
    if (data_start + covered != bytes.size()) {
      ADD_FAILURE() << what << ": accepted a file whose tensors do not cover the data section";
      return Outcome::Broken;
    }
  } catch (const Error&) {
    return Outcome::Rejected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": non-mt exception: " << e.what();
    return Outcome::Broken;
  } catch (...) {
    ADD_FAILURE() << what << ": unknown exception";
    return Outcome::Broken;
  }
  return Outcome::Opened;
}

TEST(SafetensorsFuzz, MutatedFilesOpenOrFailCleanly) {
  ScratchDir d;
  const std::string base_path = d.file("base.safetensors");
  Tensor u = Tensor::empty({5}, DType::U8);
  for (int i = 0; i < 5; ++i) u.data_as<uint8_t>()[i] = static_cast<uint8_t>(i * 37);
  safetensors_write(base_path, {{"w", Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6})},
                                {"h", Tensor::from_floats({3}, {0.5f, -1, 2}, DType::BF16)},
                                {"n", Tensor::from_floats({2}, {7, -9}, DType::I64)},
                                {"z", Tensor::empty({0, 4}, DType::F16)},
                                {"u", u}});
  const std::string base = io_test::read_bytes(base_path);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(base[i]);
  const std::string base_header = base.substr(8, hlen), base_data = base.substr(8 + hlen);

  Rng r{20240607};
  const std::string path = d.file("fuzz.safetensors");
  int opened = 0;
  for (int it = 0; it < 5000; ++it) {
    std::string f;
    const size_t kind = r.below(3);
    if (kind == 0) {
      f = mutate_bytes(r, base);
    } else if (kind == 1) {
      std::string h = mutate_header_text(r, base_header), data = base_data;
      if (r.coin(20)) data.resize(r.below(data.size() + 9), '\x5a');
      f = io_test::st_bytes(h, data);
    } else {
      size_t data_len = 0;
      std::string h = random_json_header(r, &data_len);
      f = io_test::st_bytes(h, std::string(data_len, '\x3c'));
    }
    io_test::write_bytes(path, f);
    const Outcome o = open_and_check(path, f, fmt::format("iteration {} (kind {})", it, kind));
    if (o == Outcome::Broken) return;
    opened += o == Outcome::Opened;
  }
  // The loop must exercise both outcomes to mean anything.
  std::printf("safetensors fuzz: %d of 5000 mutated files opened, the rest rejected with mt::Error\n", opened);
  EXPECT_GT(opened, 50);
  EXPECT_LT(opened, 4500);
}

TEST(SafetensorsFuzz, MutatedIndexOpensOrFailsCleanly) {
  ScratchDir d;
  Tensor a = Tensor::from_floats({4}, {1, 2, 3, 4});
  Tensor b = Tensor::from_floats({2}, {5, 6}, DType::BF16);
  Tensor c = Tensor::from_floats({3}, {7, 8, 9});
  checkpoint_write_tensors(d.path.string(), {{"a", a}, {"b", b}, {"c", c}}, {.max_shard_bytes = 20});
  const std::string index_path = d.file("model.safetensors.index.json");
  const std::string base = io_test::read_bytes(index_path);
  ASSERT_NE(base.find("model-00002-of-00002"), std::string::npos);
  const char* kSwaps[] = {"../model-00001-of-00002.safetensors", "/etc/passwd", "", ".", "..",
                          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                          "model.safetensors.index.json", "nope.safetensors", "a\\u0000b"};
  Rng r{77};
  int opened = 0;
  for (int it = 0; it < 1500; ++it) {
    std::string text = base;
    const size_t kind = r.below(3);
    if (kind == 0) {
      text = mutate_bytes(r, text);  // reuse the byte mutations; the first 8 bytes act as a "length"
      if (r.coin(50) && text.size() >= 8) text = text.substr(8);
    } else if (kind == 1) {
      text = mutate_header_text(r, text);
    } else {  // swap a quoted value for a hostile file name
      size_t p = text.find(": \"", r.below(text.size()));
      if (p != std::string::npos) {
        size_t e = text.find('"', p + 3);
        if (e != std::string::npos) text.replace(p + 3, e - p - 3, kSwaps[r.below(std::size(kSwaps))]);
      }
    }
    io_test::write_bytes(index_path, text);
    try {
      auto ck = CheckpointFiles::open(d.path.string());
      ++opened;
      for (const auto& name : ck.names()) {
        Tensor t = ck.tensor(name);
        const Tensor& want = name == "a" ? a : name == "b" ? b : c;
        ASSERT_TRUE(name == "a" || name == "b" || name == "c") << name;
        ASSERT_EQ(t.nbytes(), want.nbytes());
        ASSERT_EQ(std::memcmp(t.data(), want.data(), t.nbytes()), 0) << name;
      }
    } catch (const Error&) {
    } catch (const std::exception& e) {
      FAIL() << "iteration " << it << ": non-mt exception: " << e.what();
    } catch (...) {
      FAIL() << "iteration " << it << ": unknown exception";
    }
  }
  std::printf("index fuzz: %d of 1500 mutated indexes opened, the rest rejected with mt::Error\n", opened);
  EXPECT_GT(opened, 10);
  EXPECT_LT(opened, 1400);
}

}  // namespace
}  // namespace mt
