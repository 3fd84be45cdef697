#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/memory.h"
#include "io/atomic_file.h"
#include "io/json_text.h"

namespace mt {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the Rust reader's limit

// A read-only mapping of a whole file; unmapped when the last tensor borrowing it dies.
struct FileMapping {
  void* base = nullptr;
  size_t size = 0;
  ~FileMapping() {
    if (base) {
      ::munmap(base, size);
      memory_note_map(Device::cpu(), -static_cast<int64_t>(size));
    }
  }
};

std::shared_ptr<FileMapping> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open safetensors file {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat safetensors file {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("safetensors file {}: not a regular file", path);
  }
  auto m = std::make_shared<FileMapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size < 8) {
    ::close(fd);
    fail("safetensors file {}: {} bytes, shorter than the 8-byte header length", path, m->size);
  }
  void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file open
  if (p == MAP_FAILED) fail("cannot mmap safetensors file {} ({} bytes): {}", path, m->size, std::strerror(err));
  m->base = p;
  memory_note_map(Device::cpu(), static_cast<int64_t>(m->size));
  return m;
}

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A JSON value for an error message: compact and cut short (hostile headers can be huge).
std::string dump_short(const nlohmann::ordered_json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return s.size() <= 120 ? s : s.substr(0, 120) + "...";
}

std::string list_dtype_names() {
  std::string r;
  for (int i = 0; i <= static_cast<int>(DType::U64); ++i) {
    if (i) r += ", ";
    r += dtype_safetensors_name(static_cast<DType>(i));
  }
  return r;
}

// One header entry, validated against the data section size (offsets checked later).
SafetensorsInfo parse_entry(const std::string& path, const std::string& name, const nlohmann::ordered_json& e) {
  const std::string where = fmt::format("safetensors file {}: tensor {}", path, json_quote_short(name));
  if (!e.is_object()) fail("{}: entry must be an object, found {}", where, e.type_name());
  for (const char* k : {"dtype", "shape", "data_offsets"})
    if (!e.contains(k)) fail("{}: missing key \"{}\"", where, k);
  for (const auto& [k, v] : e.items())
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      fail("{}: unexpected key {} (expected dtype, shape, data_offsets)", where, json_quote_short(k));

  SafetensorsInfo info;
  const auto& jd = e.at("dtype");
  if (!jd.is_string()) fail("{}: dtype must be a string, found {}", where, jd.type_name());
  const auto& ds = jd.get_ref<const std::string&>();
  auto dt = dtype_from_safetensors_name(ds);
  if (!dt) fail("{}: unknown dtype {} (supported: {})", where, json_quote_short(ds), list_dtype_names());
  info.dtype = *dt;

  const auto& js = e.at("shape");
  if (!js.is_array()) fail("{}: shape must be a list of non-negative integers, found {}", where, js.type_name());
  // numel folded left to right with overflow checks, as the Rust reader does; this also keeps
  // shape_numel (a plain int64 product) free of overflow for every shape we accept.
  int64_t numel = 1;
  for (size_t i = 0; i < js.size(); ++i) {
    const auto& d = js[i];
    if (!d.is_number_unsigned())
      fail("{}: shape[{}] must be a non-negative integer, found {}", where, i,
           dump_short(d));
    const uint64_t u = d.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, static_cast<int64_t>(u), &numel))
      fail("{}: shape {} overflows the element count", where, dump_short(js));
    info.shape.push_back(static_cast<int64_t>(u));
  }
  int64_t nbytes;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(dtype_size(info.dtype)), &nbytes))
    fail("{}: shape {} of {} overflows the byte count", where, dump_short(js), ds);

  const auto& jo = e.at("data_offsets");
  if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
    fail("{}: data_offsets must be two non-negative integers, found {}", where,
         dump_short(jo));
  info.begin = jo[0].get<uint64_t>();
  info.end = jo[1].get<uint64_t>();
  if (info.begin > info.end) fail("{}: data_offsets [{}, {}] has begin > end", where, info.begin, info.end);
  if (info.end - info.begin != static_cast<uint64_t>(nbytes))
    fail("{}: data_offsets [{}, {}] span {} bytes, expected {} for {}{}", where, info.begin, info.end,
         info.end - info.begin, nbytes, ds, shape_str(info.shape));
  return info;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto map = map_file(path);
  const auto* bytes = static_cast<const unsigned char*>(map->base);
  const uint64_t header_len = read_u64_le(bytes);
  if (header_len > kMaxHeaderBytes)
    fail("safetensors file {}: header length {} exceeds the limit of {} bytes", path, header_len, kMaxHeaderBytes);
  if (8 + header_len > map->size)
    fail("safetensors file {}: header length {} runs past the end of the {}-byte file", path, header_len, map->size);
  const uint64_t data_size = map->size - 8 - header_len;

  std::string_view text(reinterpret_cast<const char*>(bytes + 8), header_len);
  auto header = json_parse_strict(text, fmt::format("safetensors file {}: header", path), 8);
  if (!header.is_object()) fail("safetensors file {}: header must be a JSON object, found {}", path, header.type_name());

  SafetensorsFile f;
  f.path_ = path;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        fail("safetensors file {}: __metadata__ must be an object, found {}", path, value.type_name());
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail("safetensors file {}: __metadata__ {} must be a string, found {}", path, json_quote_short(mk),
               mv.type_name());
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    f.infos_.emplace(key, parse_entry(path, key, value));
    f.names_.push_back(key);
  }

  // Offsets must tile the data section exactly: sorted by begin, each tensor starts where the
  // previous ended, the first at 0 and the last ends at the file end (no gaps, no overlap).
  std::sort(f.names_.begin(), f.names_.end(), [&](const std::string& a, const std::string& b) {
    const auto &ia = f.infos_.at(a), &ib = f.infos_.at(b);
    if (ia.begin != ib.begin) return ia.begin < ib.begin;
    if (ia.end != ib.end) return ia.end < ib.end;
    return a < b;
  });
  uint64_t pos = 0;
  std::string prev;
  for (const auto& name : f.names_) {
    const auto& info = f.infos_.at(name);
    if (info.begin != pos) {
      if (info.begin < pos)
        fail("safetensors file {}: tensor {}: data_offsets [{}, {}] overlap tensor {} ending at {}", path,
             json_quote_short(name), info.begin, info.end, json_quote_short(prev), pos);
      fail("safetensors file {}: tensor {}: data_offsets [{}, {}] leave a gap, expected begin {}", path,
           json_quote_short(name), info.begin, info.end, pos);
    }
    if (info.end > data_size)
      fail("safetensors file {}: tensor {}: data_offsets [{}, {}] run past the {}-byte data section", path,
           json_quote_short(name), info.begin, info.end, data_size);
    pos = info.end;
    prev = name;
  }
  if (pos != data_size)
    fail("safetensors file {}: data section has {} bytes but the tensors cover {} (trailing bytes)", path,
         data_size, pos);

  auto* data = static_cast<unsigned char*>(map->base) + 8 + header_len;
  f.data_ = Storage::borrow(data, data_size, Device::cpu(), map);
  return f;
}

const SafetensorsInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) fail("safetensors file {}: no tensor {}", path_, json_quote_short(name));
  return it->second;
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsInfo& i = info(name);
  return Tensor::from_storage(data_, i.begin, i.shape, i.dtype);
}

SafetensorsLayout safetensors_layout(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& item : tensors) {
    const auto& [name, t] = item;
    if (!t.defined()) fail("writing safetensors file {}: tensor {} is undefined", path, json_quote_short(name));
    if (!t.device().is_cpu())
      fail("writing safetensors file {}: tensor {} is on {}, expected cpu", path, json_quote_short(name),
           t.device().str());
    if (!utf8_valid(name)) fail("writing safetensors file {}: tensor name {} is not valid UTF-8", path, json_quote_short(name));
    if (name == "__metadata__") fail("writing safetensors file {}: \"__metadata__\" is not a tensor name", path);
    if (!seen.insert(name).second) fail("writing safetensors file {}: duplicate tensor name {}", path, json_quote_short(name));
    order.push_back(&item);
  }
  for (const auto& [k, v] : metadata)
    if (!utf8_valid(k) || !utf8_valid(v))
      fail("writing safetensors file {}: metadata {} is not valid UTF-8", path, json_quote_short(k));
  // The Rust writer's order: dtype descending (enum order), then name ascending byte-wise.
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    if (a->second.dtype() != b->second.dtype()) return a->second.dtype() > b->second.dtype();
    return a->first < b->first;
  });

  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      first = false;
      header += json_quote_serde(k) + ':' + json_quote_serde(v);
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    if (header.size() > 1) header += ',';
    header += json_quote_serde(item->first);
    header += ":{\"dtype\":\"";
    header += dtype_safetensors_name(t.dtype());
    header += "\",\"shape\":[";
    for (int i = 0; i < t.ndim(); ++i) header += (i ? "," : "") + std::to_string(t.dim(i));
    header += fmt::format("],\"data_offsets\":[{},{}]}}", offset, offset + t.nbytes());
    offset += t.nbytes();
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  SafetensorsLayout l;
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  l.prefix.assign(reinterpret_cast<const char*>(len_bytes), 8);
  l.prefix += header;
  uint64_t at = l.prefix.size();
  for (const auto* item : order) {
    l.order.push_back(item->first);
    l.offset[item->first] = at;
    at += item->second.nbytes();
  }
  l.file_bytes = at;
  return l;
}

void safetensors_write(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const SafetensorsLayout l = safetensors_layout(path, tensors, metadata);
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) by_name[name] = &t;
  std::vector<std::string_view> pieces;
  pieces.emplace_back(l.prefix);
  for (const std::string& name : l.order) {
    const Tensor& t = *by_name[name];
    if (t.nbytes() > 0) pieces.emplace_back(static_cast<const char*>(t.data()), t.nbytes());
  }
  file_write_atomic(path, pieces);
}

}  // namespace mt
