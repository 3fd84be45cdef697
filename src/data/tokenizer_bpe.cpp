#include "data/tokenizer_bpe.h"

#include <algorithm>
#include <bit>

#include "core/error.h"

namespace mt {

namespace {

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Printable bytes stand for themselves; the other 68 take U+0100.. in increasing byte order.
std::array<uint32_t, 256> make_byte_code_points() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp[b] = printable ? static_cast<uint32_t>(b) : next++;
  }
  return cp;
}

const std::array<uint32_t, 256>& byte_code_points() {
  static const std::array<uint32_t, 256> cp = make_byte_code_points();
  return cp;
}

struct HeapEntry {
  uint32_t rank;
  uint32_t pos;
  int32_t new_id;
};
// std heap functions build a max-heap; "greater" puts the lowest (rank, pos) on top.
bool heap_after(const HeapEntry& a, const HeapEntry& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; }

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;
};

}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  static const std::array<std::string, 256> chars = [] {
    std::array<std::string, 256> c;
    for (int b = 0; b < 256; ++b) append_utf8(byte_code_points()[b], c[b]);
    return c;
  }();
  return chars;
}

int byte_level_byte_of(uint32_t code_point) {
  static const std::array<int16_t, 324> inverse = [] {
    std::array<int16_t, 324> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[byte_code_points()[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  return code_point < inverse.size() ? inverse[code_point] : -1;
}

void MergeTable::reserve(size_t n) {
  size_t cap = std::bit_ceil(std::max<size_t>(16, n * 2));
  slots_.assign(cap, Entry{});
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  count_ = 0;
}

void MergeTable::insert_or_assign(int32_t left, int32_t right, uint32_t rank, int32_t new_id) {
  if ((count_ + 1) * 2 > slots_.size()) {
    std::vector<Entry> old = std::move(slots_);
    reserve(old.size());  // doubles: reserve(n) allocates 2n slots
    for (const Entry& e : old)
      if (e.key != kEmpty) insert_or_assign(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key & 0xFFFFFFFFu), e.rank, e.new_id);
  }
  const uint64_t key = pack(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Entry& e = slots_[i];
    if (e.key == key) {
      e.rank = rank;
      e.new_id = new_id;
      return;
    }
    if (e.key == kEmpty) {
      e = Entry{key, rank, new_id};
      ++count_;
      return;
    }
  }
}

BpeModel::BpeModel(TokenIdMap vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   bool ignore_merges, const std::string& where)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  // Ids index a table, so keep them dense enough that a hostile file cannot ask for gigabytes.
  constexpr int64_t kMaxId = 1 << 24;
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab_) {
    if (id < 0 || id >= kMaxId)
      fail("{}: field 'model.vocab': token '{}' has id {}, expected 0 <= id < {}", where, tok, id, kMaxId);
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& [tok, id] : vocab_) {
    const std::string*& slot = id_to_token_[static_cast<size_t>(id)];
    if (slot) fail("{}: field 'model.vocab': id {} is given to both '{}' and '{}'", where, id, *slot, tok);
    slot = &tok;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(byte_level_chars()[b]);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
  }
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    auto ia = vocab_.find(a), ib = vocab_.find(b);
    joined = a + b;
    auto ij = vocab_.find(joined);
    const std::string* missing = ia == vocab_.end() ? &a : ib == vocab_.end() ? &b : ij == vocab_.end() ? &joined : nullptr;
    if (missing) fail("{}: field 'model.merges[{}]': token '{}' is not in model.vocab", where, i, *missing);
    merges_.insert_or_assign(ia->second, ib->second, static_cast<uint32_t>(i), ij->second);
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    // HF looks the whole (byte-mapped) piece up before merging.
    std::string mapped;
    mapped.reserve(bytes.size() * 2);
    for (unsigned char b : bytes) mapped += byte_level_chars()[b];
    auto it = vocab_.find(mapped);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = bytes.size() < kCacheMaxPiece;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(bytes);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_bytes(bytes, out);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.try_emplace(std::string(bytes), out.begin() + static_cast<ptrdiff_t>(first), out.end());
  }
}

void BpeModel::merge_bytes(std::string_view bytes, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  sym.reserve(bytes.size());
  for (unsigned char b : bytes) {
    const int32_t id = byte_id_[b];
    if (id < 0) continue;  // HF drops characters missing from the vocabulary when there is no unk token
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, 1});
    if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
  }
  std::vector<HeapEntry> heap;
  heap.reserve(sym.size());
  for (size_t i = 0; i + 1 < sym.size(); ++i)
    if (const MergeTable::Entry* m = merges_.find(sym[i].id, sym[i + 1].id))
      heap.push_back({m->rank, static_cast<uint32_t>(i), m->new_id});
  std::make_heap(heap.begin(), heap.end(), heap_after);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), heap_after);
    const HeapEntry top = heap.back();
    heap.pop_back();
    Symbol& cur = sym[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const Symbol right = sym[static_cast<size_t>(cur.next)];
    const MergeTable::Entry* m = merges_.find(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // stale entry
    sym[static_cast<size_t>(cur.next)].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0) {
      if (const MergeTable::Entry* pm = merges_.find(sym[static_cast<size_t>(cur.prev)].id, cur.id)) {
        heap.push_back({pm->rank, static_cast<uint32_t>(cur.prev), pm->new_id});
        std::push_heap(heap.begin(), heap.end(), heap_after);
      }
    }
    if (cur.next >= 0) {
      if (const MergeTable::Entry* nm = merges_.find(cur.id, sym[static_cast<size_t>(cur.next)].id)) {
        heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), heap_after);
      }
    }
  }
  for (const Symbol& s : sym)
    if (s.len != 0) out.push_back(s.id);
}

}  // namespace mt
