// mt::Tokenizer against HF tokenizers 0.23.2 goldens (tests/fixtures/tokenizer, made by
// tools/hf_reference/make_tokenizer_goldens.py) for the real Qwen3, DeepSeek-V3 and gpt-oss files,
// plus hand-computed BPE / added-token / UTF-8 cases and malformed-file errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/tokenizer_regex.h"
#include "data/tokenizer_unicode.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(MIXTUNE_SOURCE_DIR) / "tests/fixtures/tokenizer";

fs::path data_dir() {
  if (const char* d = std::getenv("MIXTUNE_DATA_DIR"); d && *d) return d;
  return fs::path(MIXTUNE_SOURCE_DIR) / ".deps/data";
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error("cannot open " + p.string());
  return json::parse(f);
}

// The real tokenizer files are not in the repository; their absence is a failure, not a skip.
const Tokenizer& real_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, Tokenizer> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const fs::path p = data_dir() / "tokenizers" / name / "tokenizer.json";
  if (!fs::exists(p))
    throw std::runtime_error(p.string() + " is missing: run scripts/fetch-data.sh (or set MIXTUNE_DATA_DIR)");
  return cache.emplace(name, Tokenizer::from_file(p.string())).first->second;
}

const json& corpus() {
  static const json c = read_json(kFixtures / "corpus.json");
  return c;
}

std::string show(const std::string& s) { return json(s).dump(-1, ' ', true); }

std::string show_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, size_t from) {
  std::string out;
  for (size_t i = from; i < ids.size() && i < from + 6; ++i) {
    std::string t;
    try {
      t = tok.id_to_token(ids[i]);
    } catch (const Error&) {
      t = "?";
    }
    out += std::to_string(ids[i]) + "=" + show(t) + " ";
  }
  return out;
}

void check_encode_goldens(const std::string& name) {
  const Tokenizer& tok = real_tokenizer(name);
  const json golden = read_json(kFixtures / (name + ".json"));
  const json& enc = golden.at("encode");
  ASSERT_EQ(enc.size(), corpus().size());
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < enc.size(); ++i) {
    const std::string text = corpus()[i].get<std::string>();
    const std::vector<int32_t> want = enc[i].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text);
    if (got == want) continue;
    if (mismatches++ == 0) {
      size_t d = 0;
      while (d < got.size() && d < want.size() && got[d] == want[d]) ++d;
      first = "corpus[" + std::to_string(i) + "] = " + show(text) + "\n  first difference at token " +
              std::to_string(d) + "\n  HF:      " + show_ids(tok, want, d) + "\n  mixtune: " + show_ids(tok, got, d);
    }
  }
  EXPECT_EQ(mismatches, 0u) << name << ": " << mismatches << " of " << enc.size() << " strings differ; first:\n"
                            << first;
}

void check_decode_goldens(const std::string& name) {
  const Tokenizer& tok = real_tokenizer(name);
  const json golden = read_json(kFixtures / (name + ".json"));
  size_t mismatches = 0, rows = 0;
  std::string first;
  for (const json& row : golden.at("decode")) {
    ++rows;
    const std::vector<int32_t> ids = row.at("ids").get<std::vector<int32_t>>();
    const std::string want = row.at("text").get<std::string>();
    const std::string got = tok.decode(ids);
    if (got == want) continue;
    if (mismatches++ == 0) first = "ids " + row.at("ids").dump() + "\n  HF:      " + show(want) + "\n  mixtune: " + show(got);
  }
  EXPECT_GT(rows, 0u);
  EXPECT_EQ(mismatches, 0u) << name << ": " << mismatches << " of " << rows << " decode rows differ; first:\n" << first;
}

TEST(TokenizerGolden, Qwen3Encode) { check_encode_goldens("qwen3"); }
TEST(TokenizerGolden, Qwen3Decode) { check_decode_goldens("qwen3"); }
TEST(TokenizerGolden, DeepseekV3Encode) { check_encode_goldens("deepseek_v3"); }
TEST(TokenizerGolden, DeepseekV3Decode) { check_decode_goldens("deepseek_v3"); }
TEST(TokenizerGolden, GptossEncode) { check_encode_goldens("gptoss"); }
TEST(TokenizerGolden, GptossDecode) { check_decode_goldens("gptoss"); }

TEST(TokenizerGolden, Qwen3Vocabulary) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  EXPECT_EQ(tok.vocab_size(), 151669);  // 151,643 BPE tokens + 26 added (hf-numerics.md §9.1)
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.token_to_id("<think>"), 151667);
  EXPECT_EQ(tok.token_to_id("Ġ"), 220);
  EXPECT_FALSE(tok.token_to_id("no such token").has_value());
  EXPECT_EQ(tok.id_to_token(151643), "<|endoftext|>");
  EXPECT_TRUE(tok.is_special(151645));
  EXPECT_FALSE(tok.is_special(151667));  // <think> is atomic but not special
  EXPECT_THROW(tok.id_to_token(151669), Error);  // padded embedding rows have no token
  EXPECT_THROW(tok.id_to_token(-1), Error);
  // HF skips ids that name no token, and special tokens on request.
  EXPECT_EQ(tok.decode({9707, 151700, -5, 1879}), "Hello world");
  EXPECT_EQ(tok.decode({151644, 9707, 151645}, true), "Hello");
  EXPECT_EQ(real_tokenizer("deepseek_v3").vocab_size(), 128815);  // 3 of 818 added tokens are in the vocab
  EXPECT_EQ(real_tokenizer("gptoss").vocab_size(), 200019);
}

TEST(TokenizerGolden, InvalidUtf8IsReplacedFirst) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  EXPECT_EQ(tok.encode("a\xFF" "b\xE2\x82"), tok.encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD"));
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
}

TEST(TokenizerGolden, ConcurrentEncodeMatchesGoldens) {
  const Tokenizer& tok = real_tokenizer("qwen3");
  const json golden = read_json(kFixtures / "qwen3.json");
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < corpus().size(); i += 2)
        bad[static_cast<size_t>(t)] += tok.encode(corpus()[i].get<std::string>()) != golden["encode"][i].get<std::vector<int32_t>>();
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[static_cast<size_t>(t)], 0) << "thread " << t;
}

// ---- hand-built tokenizer.json files -------------------------------------------------------

json tiny_tokenizer() {
  // Byte-level vocabulary for a, b, c, d, space ("Ġ") plus merged tokens.
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", " ?[a-d]+|\\s+"}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}}},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"d", 3}, {"Ġ", 4}, {"ab", 5}, {"bc", 6}, {"abc", 7}, {"Ġa", 8}, {"cd", 9}, {"abcd", 10}}},
        {"merges", json::array()}}}};
}

// nlohmann reads {{"a", "b"}} as an object, so merge lists are built explicitly.
json pairs(std::initializer_list<std::pair<const char*, const char*>> list) {
  json a = json::array();
  for (const auto& [l, r] : list) a.push_back(json::array({l, r}));
  return a;
}

Tokenizer tiny(const json& j) { return Tokenizer::from_json_text(j.dump(), "tiny/tokenizer.json"); }

TEST(TokenizerBpe, LowestRankMergesFirst) {
  json j = tiny_tokenizer();
  // "b c" outranks "a b": abc -> a|bc; there is no (a, bc) merge, so it stays two tokens.
  j["model"]["merges"] = pairs({{"b", "c"}, {"a", "b"}});
  EXPECT_EQ(tiny(j).encode("abc"), (std::vector<int32_t>{0, 6}));
  j["model"]["merges"] = pairs({{"a", "b"}, {"b", "c"}, {"ab", "c"}});
  EXPECT_EQ(tiny(j).encode("abc"), (std::vector<int32_t>{7}));
  // Legacy "a b" strings mean the same thing; "#version" lines are not merges.
  j["model"]["merges"] = {"#version: 0.2", "a b", "b c", "ab c"};
  EXPECT_EQ(tiny(j).encode("abc"), (std::vector<int32_t>{7}));
  // Equal ranks cannot happen, but equal pairs can: "abab" merges both (a,b) occurrences.
  j["model"]["merges"] = pairs({{"a", "b"}});
  EXPECT_EQ(tiny(j).encode("abab"), (std::vector<int32_t>{5, 5}));
  // A new pair formed by a merge is considered: (c,d) then (ab,cd) -> abcd.
  j["model"]["merges"] = pairs({{"c", "d"}, {"a", "b"}, {"ab", "cd"}});
  EXPECT_EQ(tiny(j).encode("abcd"), (std::vector<int32_t>{10}));
  // The regex splits " ab" and " c" apart; the space merges with a only where a merge exists.
  j["model"]["merges"] = pairs({{"Ġ", "a"}});
  EXPECT_EQ(tiny(j).encode(" ab c"), (std::vector<int32_t>{8, 1, 4, 2}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholePiece) {
  json j = tiny_tokenizer();
  j["model"]["merges"] = pairs({{"a", "b"}});
  EXPECT_EQ(tiny(j).encode("abcd"), (std::vector<int32_t>{5, 2, 3}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(tiny(j).encode("abcd"), (std::vector<int32_t>{10}));
  EXPECT_EQ(tiny(j).encode("abd"), (std::vector<int32_t>{5, 3}));  // "abd" is not a token: merges apply
}

TEST(TokenizerBpe, AddedTokensLeftmostLongestThenNormalized) {
  json j = tiny_tokenizer();
  j["model"]["merges"] = pairs({{"a", "b"}});
  auto added = [](int id, const char* content, bool normalized) {
    return json{{"id", id},          {"content", content}, {"single_word", false}, {"lstrip", false},
                {"rstrip", false},   {"normalized", normalized}, {"special", true}};
  };
  j["added_tokens"] = {added(11, "<x>", false), added(12, "<x>a", false), added(9, "cd", true), added(13, "bcd", false)};  // "cd" is also model token 9
  const Tokenizer tok = tiny(j);
  EXPECT_EQ(tok.vocab_size(), 14);  // 11 model tokens + 4 added - 1 shared
  // Longest at the leftmost start: "<x>a" beats "<x>".
  EXPECT_EQ(tok.encode("ab<x>ab<x>"), (std::vector<int32_t>{5, 12, 1, 11}));
  // Raw (normalized=false) tokens are taken first: "bcd" wins over the normalized "cd".
  EXPECT_EQ(tok.encode("abcd"), (std::vector<int32_t>{0, 13}));
  EXPECT_EQ(tok.encode("acd"), (std::vector<int32_t>{0, 9}));
  EXPECT_EQ(tok.decode({12, 5, 9}), "<x>aabcd");
  EXPECT_EQ(tok.decode({12, 5, 9}, true), "ab");
}

TEST(TokenizerBpe, AddedTokenIdsMustBeWhatHfAssigns) {
  json j = tiny_tokenizer();
  j["added_tokens"] = {{{"id", 20}, {"content", "<x>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                        {"normalized", false}, {"special", true}}};
  try {
    tiny(j);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("added_tokens[0].id"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("would assign it id 11"), std::string::npos) << e.what();
  }
}

TEST(TokenizerBpe, ByteLevelRegexAndPrefixSpace) {
  json j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["model"]["merges"] = pairs({{"Ġ", "a"}});
  // add_prefix_space turns "ab" into " ab"; the GPT-2 regex keeps " ab" whole.
  EXPECT_EQ(tiny(j).encode("ab"), (std::vector<int32_t>{8, 1}));
  EXPECT_EQ(tiny(j).decode({8, 1}), " ab");
}

TEST(TokenizerBpe, DecodeMapsBytesAndRepairsUtf8) {
  json j = tiny_tokenizer();
  // "Ã" (U+00C3) stands for byte 0xC3 and "©" for 0xA9: together "é". "Ċ" is '\n'.
  j["model"]["vocab"]["Ã"] = 11;
  j["model"]["vocab"]["©"] = 12;
  j["model"]["vocab"]["Ċ"] = 13;
  j["model"]["vocab"]["x y"] = 14;  // contains a plain space: not byte-level, copied as is
  const Tokenizer tok = tiny(j);
  EXPECT_EQ(tok.decode({11, 12, 13}), "\xC3\xA9\n");
  EXPECT_EQ(tok.decode({11, 0}), "\xEF\xBF\xBD" "a");  // a lone lead byte becomes U+FFFD
  EXPECT_EQ(tok.decode({14, 4}), "x y ");
}

// ---- UTF-8 and NFC helpers -------------------------------------------------------------------

TEST(TokenizerUnicode, LossyReplacesMaximalSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("plain ascii"), "plain ascii");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");  // valid 4-byte
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), R);                        // truncated: one subpart
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98" "A"), R + "A");
  EXPECT_EQ(utf8_lossy("\xE0\x80"), R + R);          // E0 needs A0..BF next
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), R + R + R);  // surrogate
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), R + R);                  // overlong
  EXPECT_EQ(utf8_lossy("\x80\xBF"), R + R);                  // stray continuations
  EXPECT_EQ(utf8_lossy("a\xC3"), "a" + R);
  EXPECT_EQ(utf8_lossy("\xE2\x82\xE2\x82\xAC"), R + "\xE2\x82\xAC");
  EXPECT_EQ(utf8_lossy(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_TRUE(utf8_is_valid("\xE2\x82\xAC"));
  EXPECT_FALSE(utf8_is_valid("\xE2\x82"));
}

TEST(TokenizerUnicode, NfcComposesAcrossAsciiBoundaries) {
  EXPECT_EQ(nfc_normalize("e\xCC\x81"), "\xC3\xA9");                      // e + U+0301 -> é
  EXPECT_EQ(nfc_normalize("xA\xCC\x8Ay"), "x\xC3\x85y");                  // A + ring -> Å
  EXPECT_EQ(nfc_normalize("\xE2\x84\xAB"), "\xC3\x85");                    // U+212B angstrom -> Å
  EXPECT_EQ(nfc_normalize("\xEF\xAC\x81"), "\xEF\xAC\x81");                // ﬁ is compatibility-only
  EXPECT_EQ(nfc_normalize("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");    // Hangul jamo -> 가
  EXPECT_EQ(nfc_normalize("a\xCC\x81\xCC\xA3"), "\xE1\xBA\xA1\xCC\x81");  // reordered: ạ + U+0301
  EXPECT_EQ(nfc_normalize(std::string("a\0e\xCC\x81", 5)), std::string("a\0\xC3\xA9", 4));
  EXPECT_EQ(nfc_normalize("K\xE2\x84\xAA"), "KK");  // Kelvin sign -> K
}

// ---- the chained regex (one onig_search for up to 16 pieces) against plain find_iter --------

TEST(TokenizerRegex, ChainedSearchEqualsOneMatchAtATime) {
  const char* patterns[] = {
      // Qwen3, gpt-oss, DeepSeek-V3 (stages 1 and 3) and GPT-2 ByteLevel
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      R"(\p{N}{1,3})",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
      // patterns that match the empty string exercise onig's find_iter rules
      "a*", "\\b", "x?|\\s+", "(?=a)|b",
  };
  const std::vector<std::string> pool = {"a", "b", "x", "Z", "1", "23", " ", "  ", "\n", "\r\n", "\t", "'s", "'LL", "!",
                                         ".", "/", "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\xEF\xBB\xBF", "\xE1\xA0\x8E",
                                         "\xC3\xA9", "e\xCC\x81", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xD9\xA3", "\xC2\xB2"};
  std::mt19937 rng(1234);
  for (const char* pat : patterns) {
    const TokenizerRegex chained(pat, "test", true), single(pat, "test", false);
    for (int it = 0; it < 400; ++it) {
      std::string text;
      const int n = static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) text += pool[rng() % pool.size()];
      std::vector<ByteRange> a, b;
      chained.find_all(text, a);
      single.find_all(text, b);
      ASSERT_EQ(a.size(), b.size()) << "pattern " << pat << " text " << show(text);
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i].begin, b[i].begin) << "pattern " << pat << " text " << show(text) << " match " << i;
        ASSERT_EQ(a[i].end, b[i].end) << "pattern " << pat << " text " << show(text) << " match " << i;
      }
    }
  }
  // find_iter on "aab" with "a*": "aa" at 0, the empty match at 2 right after it is skipped, "" at 3.
  std::vector<ByteRange> m;
  TokenizerRegex("a*", "test").find_all("aab", m);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].begin, 0u);
  EXPECT_EQ(m[0].end, 2u);
  EXPECT_EQ(m[1].begin, 3u);
  EXPECT_EQ(m[1].end, 3u);
}

// ---- malformed files: one line, naming the file and the field -------------------------------

void expect_load_error(const json& j, const std::string& field) {
  try {
    tiny(j);
    FAIL() << "expected an error mentioning " << field;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tiny/tokenizer.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(TokenizerLoad, MalformedFilesNameFileAndField) {
  json j = tiny_tokenizer();
  j.erase("model");
  expect_load_error(j, "'model' is missing");

  j = tiny_tokenizer();
  j["model"]["merges"] = json::array({json::array({"a", "b", "c"})});
  expect_load_error(j, "model.merges[0]");
  j["model"]["merges"] = json::array({"a b c"});
  expect_load_error(j, "model.merges[0]");
  j["model"]["merges"] = json::array({json::array({"a", "b"}), 7});
  expect_load_error(j, "model.merges[1]");
  j["model"]["merges"] = pairs({{"a", "b"}, {"b", "z"}});
  expect_load_error(j, "model.merges[1]': token 'z' is not in model.vocab");
  j["model"]["merges"] = pairs({{"c", "a"}});  // "ca" is not in the vocabulary
  expect_load_error(j, "token 'ca'");

  j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace";
  expect_load_error(j, "pre_tokenizer.pretokenizers[0].type");
  j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_load_error(j, "pre_tokenizer.pretokenizers[0].behavior");
  j = tiny_tokenizer();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  expect_load_error(j, "pre_tokenizer.pretokenizers[0].pattern.Regex");
  j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  expect_load_error(j, "normalizer.type");
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}};
  expect_load_error(j, "normalizer.normalizers[1].type");
  j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect_load_error(j, "model.type");
  j = tiny_tokenizer();
  j["model"]["vocab"]["e"] = "five";
  expect_load_error(j, "model.vocab[\"e\"]");
  j = tiny_tokenizer();
  j["model"]["vocab"]["e"] = 3;
  expect_load_error(j, "id 3 is given to both");
  j = tiny_tokenizer();
  j["model"]["byte_fallback"] = true;
  expect_load_error(j, "model.byte_fallback");
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(j, "decoder.type");
  j = tiny_tokenizer();
  j["added_tokens"] = {{{"id", 11}, {"content", "<x>"}, {"single_word", false}, {"lstrip", true}, {"rstrip", false},
                        {"normalized", false}, {"special", true}}};
  expect_load_error(j, "added_tokens[0].lstrip");
  j["added_tokens"] = {{{"id", 11}, {"content", "<x>"}}};
  expect_load_error(j, "added_tokens[0].special' is missing");

  try {
    Tokenizer::from_json_text("{\"model\": ", "tiny/tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiny/tokenizer.json: not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/dir/tokenizer.json"), Error);
}

}  // namespace
}  // namespace mt
