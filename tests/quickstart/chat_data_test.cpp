// tools/quickstart_data/make_chat_data.mjs on small hand-written inputs in the real file formats (quiz(6) index and
// data files, fortune riddles): the exact chat lines, the eval split (recomputed here with FNV-1a), the generated
// arithmetic (recomputed here with mulberry32), byte-identical reruns, and one-line errors that leave no output.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

struct RunResult {
  int code;
  std::string out;
  std::string err;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// Runs the builder with `args` (already shell-quoted where needed).
RunResult run_builder(const fs::path& dir, const std::string& args) {
  const fs::path err_file = dir / "stderr.txt";
  const std::string cmd = "node " + std::string(MIXTUNE_SOURCE_DIR) + "/tools/quickstart_data/make_chat_data.mjs " +
                          args + " 2>" + err_file.string();
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WEXITSTATUS(status), out, read_file(err_file)};
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// One chat line exactly as the builder writes it (JSON.stringify key order, no spaces).
std::string chat_line(const std::string& user, const std::string& assistant) {
  nlohmann::ordered_json j;
  j["messages"] = nlohmann::ordered_json::array({
      {{"role", "system"}, {"content", "S"}},
      {{"role", "user"}, {"content", user}},
      {{"role", "assistant"}, {"content", assistant}},
  });
  return j.dump();
}

uint32_t fnv1a32(const std::string& s) {
  uint32_t h = 0x811c9dc5u;
  for (unsigned char c : s) h = (h ^ c) * 0x01000193u;
  return h;
}

// mulberry32, the builder's generator: a 32-bit state stepped by 0x6d2b79f5, output / 2^32.
struct Mulberry32 {
  uint32_t s;
  double next() {
    s += 0x6d2b79f5u;
    uint32_t t = s;
    t = (t ^ (t >> 15)) * (t | 1u);
    t ^= t + (t ^ (t >> 7)) * (t | 61u);
    return double(t ^ (t >> 14)) / 4294967296.0;
  }
};

// The builder's arithmetic questions for (n, seed), computed independently.
std::vector<std::pair<std::string, std::string>> expected_arithmetic(int n, uint32_t seed) {
  Mulberry32 r{seed};
  std::set<std::string> seen;
  std::vector<std::pair<std::string, std::string>> out;
  while (int(out.size()) < n) {
    const bool plus = r.next() < 0.5;
    int a = int(std::floor(r.next() * 100));
    int b = int(std::floor(r.next() * 100));
    if (!plus && b > a) std::swap(a, b);
    const std::string q = "What is " + std::to_string(a) + (plus ? " + " : " - ") + std::to_string(b) + "?";
    if (!seen.insert(q).second) continue;
    out.emplace_back(q, std::to_string(plus ? a + b : a - b) + ".");
  }
  return out;
}

class QuickstartChatData : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("command -v node >/dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
    dir = fs::temp_directory_path() / ("mt_chat_data_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "quiz");
    // The index names the Debian paths; the builder looks the files up beside the index. greek is listed but
    // has no file and no template: it must be ignored.
    write_file(dir / "quiz/index",
               "/usr/share/games/bsdgames/quiz/asia:Asia{n}:cap{ital}\n"
               "/usr/share/games/bsdgames/quiz/europe:Europe{an}:cap{ital}\n"
               "/usr/share/games/bsdgames/quiz/elements:symbol:number:weight:element\n"
               "/usr/share/games/bsdgames/quiz/seq-easy:easy{-}{seq{uence}}:next:name\n"
               "/usr/share/games/bsdgames/quiz/babies:baby:adult\n"
               "/usr/share/games/bsdgames/quiz/morse:clear|alpha{bet{ic}}:morse\n"
               "/usr/share/games/bsdgames/quiz/posneg:pos{itive}:neg{ative}\n"
               "/usr/share/games/bsdgames/quiz/greek:greek:english\n");
    write_file(dir / "quiz/asia", "Armenia:Yerevan\n");
    // Alternates (first wins), a bracket group, overstruck accents (the clean plain letter wins), an empty answer
    // (not asked), and Armenia again (already asked by asia).
    write_file(dir / "quiz/europe",
               "Austria:Vienna|Wien\n"
               "Andorra:Andorra la V[ell|iej]a\n"
               "Iceland:Reykjav['\bi|i\b'|i]k\n"
               "Nowhere:\n"
               "Armenia:Yerevan\n");
    // A continuation line.
    write_file(dir / "quiz/elements", "H:1:1.008:\\\nHydrogen\n\nHe:2:4.003:Helium\n");
    // "next" is expanded without optional parts. As in quiz(6) the closer decides: "[...}" is optional,
    // "{...]" is not.
    write_file(dir / "quiz/seq-easy",
               "1,2,3,5,8,13:2[1|one]{(Fibonacci)}:Fibonacci{ numbers}\n"
               "1,4,11,20:{3]1[ (squares base 8)}:[Squares|n2} base 8\n");
    // One question per adult; an optional part included in the answer.
    write_file(dir / "quiz/babies", "cub:lion|tiger\n{baby }pup:seal\n");
    write_file(dir / "quiz/morse", "A:.-\n");
    // An escaped ':' inside a category.
    write_file(dir / "quiz/posneg", "yes\\: on:no\\: off\n");
    write_file(dir / "riddles",
               "FORTUNE PROVIDES QUESTIONS FOR THE GREAT ANSWERS: #5\n"
               "A:\tThe Halls of Montezuma.\n"
               "Q:\tName two families.\n"
               "%\n"
               "Q:\tHow do you catch a unique rabbit?\n"
               "A:\tUnique up on it!\n"
               "\n"
               "Q:\tHow do you catch a tame\n"
               "\trabbit?\n"
               "A:\tThe tame way!\n"
               "\t\t-- someone\n"
               "%\n"
               "Q:\tHow do you keep a moron in suspense?\n"
               "%\n"
               "Q:\tToo long?\n"
               "A:\tThis answer is forty-one characters long.\n"
               "%\n"
               "Knock, knock!\n"
               "\tWho's there?\n"
               "%\n");
  }
  void TearDown() override { fs::remove_all(dir); }

  std::string args(const std::string& out, int eval_percent) const {
    return "--out " + (dir / out).string() + " --quiz-dir " + (dir / "quiz").string() + " --riddles " +
           (dir / "riddles").string() + " --arith 4 --seed 7 --riddle-max-chars 40 --system S --eval-percent " +
           std::to_string(eval_percent);
  }

  fs::path dir;
};

TEST_F(QuickstartChatData, ExactLinesSplitAndDeterminism) {
  std::vector<std::pair<std::string, std::string>> pairs = {
      {"What is the capital of Armenia?", "Yerevan."},
      {"Yerevan is the capital of which country?", "Armenia."},
      {"What is the capital of Austria?", "Vienna."},
      {"Vienna is the capital of which country?", "Austria."},
      {"What is the capital of Andorra?", "Andorra la Vella."},
      {"Andorra la Vella is the capital of which country?", "Andorra."},
      {"What is the capital of Iceland?", "Reykjavik."},
      {"Reykjavik is the capital of which country?", "Iceland."},
      {"Which chemical element has the symbol H?", "Hydrogen."},
      {"Which chemical element has the symbol He?", "Helium."},
      {"What is the chemical symbol of Hydrogen?", "H."},
      {"What is the chemical symbol of Helium?", "He."},
      {"What is the atomic number of Hydrogen?", "1."},
      {"What is the atomic number of Helium?", "2."},
      {"What comes next in the sequence 1,2,3,5,8,13?", "21."},
      {"What is the sequence 1,2,3,5,8,13 called?", "Fibonacci numbers."},
      {"What comes next in the sequence 1,4,11,20?", "31."},
      {"What is the sequence 1,4,11,20 called?", "Squares base 8."},
      {"What is a baby lion called?", "Cub."},
      {"What is a baby tiger called?", "Cub."},
      {"What is a baby seal called?", "Baby pup."},
      {"What is A in Morse code?", ".-"},
      {"Which letter is .- in Morse code?", "A."},
      {"What is the opposite of yes: on?", "No: off."},
      {"What is the opposite of no: off?", "Yes: on."},
      {"Name two families.", "The Halls of Montezuma."},
      {"How do you catch a unique rabbit?", "Unique up on it!"},
      {"How do you catch a tame rabbit?", "The tame way!"},
  };
  const auto arith = expected_arithmetic(4, 7);
  pairs.insert(pairs.end(), arith.begin(), arith.end());
  ASSERT_EQ(pairs.size(), 32u);

  const RunResult r = run_builder(dir, args("a", 50));
  ASSERT_EQ(r.code, 0) << r.err;
  std::multiset<std::string> want_train, want_eval;
  for (const auto& [q, a] : pairs) (fnv1a32(q) % 100 < 50 ? want_eval : want_train).insert(chat_line(q, a));
  const auto train = lines_of(read_file(dir / "a/train.jsonl"));
  const auto eval = lines_of(read_file(dir / "a/eval.jsonl"));
  EXPECT_EQ(std::multiset<std::string>(train.begin(), train.end()), want_train);
  EXPECT_EQ(std::multiset<std::string>(eval.begin(), eval.end()), want_eval);
  ASSERT_FALSE(want_eval.empty());
  ASSERT_FALSE(want_train.empty());
  EXPECT_NE(r.out.find("32 examples: train " + std::to_string(want_train.size()) + ", eval " +
                       std::to_string(want_eval.size())),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("quiz 25 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("riddles 3 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("arithmetic 4 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dropped 2 repeated questions"), std::string::npos) << r.out;

  // Same inputs: byte-identical files.
  ASSERT_EQ(run_builder(dir, args("b", 50)).code, 0);
  EXPECT_EQ(read_file(dir / "a/train.jsonl"), read_file(dir / "b/train.jsonl"));
  EXPECT_EQ(read_file(dir / "a/eval.jsonl"), read_file(dir / "b/eval.jsonl"));

  // --eval-percent 0: everything in train, an empty eval file.
  ASSERT_EQ(run_builder(dir, args("c", 0)).code, 0);
  EXPECT_EQ(lines_of(read_file(dir / "c/train.jsonl")).size(), 32u);
  EXPECT_EQ(read_file(dir / "c/eval.jsonl"), "");
}

void expect_one_line_error(const RunResult& r, const std::vector<std::string>& must_contain) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("make_chat_data: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  for (const auto& s : must_contain) EXPECT_NE(r.err.find(s), std::string::npos) << r.err;
}

TEST_F(QuickstartChatData, BadInputIsOneLineAndLeavesNoOutput) {
  // Unclosed optional group: file and line named.
  write_file(dir / "quiz/europe", "Austria:Vienna\nFrance:Par{is\n");
  RunResult r = run_builder(dir, args("out1", 5));
  expect_one_line_error(r, {(dir / "quiz/europe").string() + ":2:", "unclosed"});
  EXPECT_FALSE(fs::exists(dir / "out1/train.jsonl"));
  EXPECT_FALSE(fs::exists(dir / "out1/eval.jsonl"));
  write_file(dir / "quiz/europe", "Austria:Vienna\n");

  // A closer with nothing open.
  write_file(dir / "quiz/morse", "A:.-]\n");
  expect_one_line_error(run_builder(dir, args("out2", 5)), {"quiz/morse:1:", "unmatched ']'"});
  write_file(dir / "quiz/morse", "A:.-\n");

  // The index does not name the category a question needs.
  write_file(dir / "quiz/index", "/usr/share/games/bsdgames/quiz/europe:country:cap{ital}\n");
  expect_one_line_error(run_builder(dir, args("out3", 5)), {"quiz/index:1", "europe", "European"});

  // Riddles that are not UTF-8.
  write_file(dir / "quiz/index", "/usr/share/games/bsdgames/quiz/europe:Europe{an}:cap{ital}\n");
  write_file(dir / "riddles", "Q:\tWhy?\nA:\tBecause \xff.\n%\n");
  expect_one_line_error(run_builder(dir, args("out4", 5)), {(dir / "riddles").string(), "not valid UTF-8"});
  EXPECT_FALSE(fs::exists(dir / "out4/train.jsonl"));

  // A missing quiz tree names the index and the package.
  fs::remove_all(dir / "quiz");
  expect_one_line_error(run_builder(dir, args("out5", 5)), {"quiz/index", "bsdgames"});

  // Bad option value.
  expect_one_line_error(run_builder(dir, "--out " + (dir / "out6").string() + " --arith many"), {"--arith"});
}

}  // namespace
