// The torch.save reader of `phasor op` (see cli/pt_file.h).
#include "cli/pt_file.h"

#include <ATen/Functions.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>
#include <unordered_map>

namespace phasor::cli {

std::string PtValue::kind_name() const {
  switch (kind) {
    case Kind::none:
      return "None";
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "int";
    case Kind::real:
      return "float";
    case Kind::string:
      return "str";
    case Kind::tuple:
      return "tuple";
    case Kind::list:
      return "list";
    case Kind::dict:
      return "dict";
    case Kind::tensor:
      return "tensor";
  }
  return "?";
}

std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && u != '\\')
      out += c;
    else
      out += std::string("\\x") + hex[u >> 4] + hex[u & 15];
  }
  return out;
}

namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw std::runtime_error(why);
}

std::uint64_t little_endian(const unsigned char* p, int width) {
  std::uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// ---- the zip archive --------------------------------------------------------------------------

struct Entry {
  std::size_t offset = 0, size = 0;  // the stored bytes in the file
};

// The entries of a zip archive of stored entries (what torch.save writes), each checked against
// the file's size and its CRC-32. The end-of-central-directory record's counts and offsets are
// used (torch.save also writes a zip64 record; archives beyond 4 GiB are refused).
std::map<std::string, Entry> read_zip(const std::vector<char>& file) {
  const auto* b = reinterpret_cast<const unsigned char*>(file.data());
  const std::size_t n = file.size();
  if (n < 22) refuse("not a zip archive (" + std::to_string(n) + " bytes)");
  std::size_t end = n - 22;  // the end-of-central-directory record: the last "PK\5\6"
  const std::size_t lowest = n - 22 > 65535 ? n - 22 - 65535 : 0;
  while (std::memcmp(b + end, "PK\5\6", 4) != 0) {
    if (end == lowest) refuse("not a zip archive (no end of central directory)");
    --end;
  }
  const std::uint64_t count = little_endian(b + end + 10, 2),
                      cd_size = little_endian(b + end + 12, 4),
                      cd_offset = little_endian(b + end + 16, 4);
  if (count == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF)
    refuse("a zip64 archive (beyond 4 GiB or 65,535 entries)");
  if (cd_offset > end || cd_size > end - cd_offset)
    refuse("a central directory outside the archive");
  std::map<std::string, Entry> entries;
  std::size_t at = cd_offset;
  const std::size_t cd_end = cd_offset + cd_size;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (cd_end - at < 46 || std::memcmp(b + at, "PK\1\2", 4) != 0)
      refuse("a corrupt central directory (entry " + std::to_string(i) + ")");
    const std::uint64_t flags = little_endian(b + at + 8, 2),
                        method = little_endian(b + at + 10, 2), crc = little_endian(b + at + 16, 4),
                        stored = little_endian(b + at + 20, 4),
                        size = little_endian(b + at + 24, 4),
                        name_length = little_endian(b + at + 28, 2),
                        extra = little_endian(b + at + 30, 2),
                        comment = little_endian(b + at + 32, 2),
                        local = little_endian(b + at + 42, 4);
    if (cd_end - at - 46 < name_length + extra + comment)
      refuse("a corrupt central directory (entry " + std::to_string(i) + ")");
    const std::string name(reinterpret_cast<const char*>(b + at + 46), name_length);
    at += 46 + name_length + extra + comment;
    const std::string what = "entry '" + printable(name) + "'";
    if (flags & 1) refuse(what + ": encrypted");
    if (method != 0 || stored != size)
      refuse(what + ": compressed (method " + std::to_string(method) +
             "); torch.save stores its entries uncompressed");
    if (local > n || n - local < 30 || std::memcmp(b + local, "PK\3\4", 4) != 0)
      refuse(what + ": no local header at byte " + std::to_string(local));
    const std::uint64_t data =
        local + 30 + little_endian(b + local + 26, 2) + little_endian(b + local + 28, 2);
    if (data > n || n - data < size)
      refuse(what + ": " + std::to_string(size) + " bytes at byte " + std::to_string(data) +
             ", beyond the file's " + std::to_string(n));
    const uLong computed = crc32_z(crc32_z(0L, Z_NULL, 0), b + data, static_cast<z_size_t>(size));
    if (computed != crc) refuse(what + ": CRC-32 mismatch (corrupt)");
    if (!entries
             .emplace(name, Entry{static_cast<std::size_t>(data), static_cast<std::size_t>(size)})
             .second)
      refuse(what + ": twice");
  }
  return entries;
}

// ---- the pickle -------------------------------------------------------------------------------

// A value of the pickle machine: a PtValue, or what only exists while unpickling (a mark, a
// global, a persistent storage).
struct Obj {
  enum class Kind : std::uint8_t {
    none,
    boolean,
    integer,
    real,
    string,
    tuple,
    list,
    dict,
    tensor,
    mark,
    global,
    storage
  };
  Kind kind = Kind::none;
  explicit Obj(Kind k = Kind::none) : kind(k) {}
  bool boolean = false;
  std::int64_t integer = 0;  // also a storage's element count
  double real = 0;
  std::string string;  // also a global's "module.name", a storage's key
  std::vector<Obj> items;
  std::vector<std::pair<Obj, Obj>> entries;
  at::Tensor tensor;
  at::ScalarType dtype = at::kFloat;  // a storage's
  // The values in this one, itself included (a string also weighs its bytes): every copy made
  // (a memo put or get) is counted against a limit proportional to the pickle's size, so that
  // repeated copies of copies cannot grow memory beyond a multiple of the file.
  std::int64_t nodes = 1;
  int depth = 1;  // of nesting
};

constexpr int kMaxDepth = 64;

const std::map<std::string, at::ScalarType>& storage_types() {
  static const std::map<std::string, at::ScalarType> types = {
      {"torch.FloatStorage", at::kFloat}, {"torch.DoubleStorage", at::kDouble},
      {"torch.HalfStorage", at::kHalf},   {"torch.BFloat16Storage", at::kBFloat16},
      {"torch.IntStorage", at::kInt},     {"torch.LongStorage", at::kLong},
      {"torch.ShortStorage", at::kShort}, {"torch.CharStorage", at::kChar},
      {"torch.ByteStorage", at::kByte},   {"torch.BoolStorage", at::kBool}};
  return types;
}

class Unpickler {
 public:
  Unpickler(const std::map<std::string, Entry>& entries, const std::string& folder,
            const std::vector<char>& file, const Entry& pickle)
      : entries_(entries),
        folder_(folder),
        file_(file),
        p_(reinterpret_cast<const unsigned char*>(file.data()) + pickle.offset),
        n_(pickle.size),
        max_nodes_(16 * static_cast<std::int64_t>(pickle.size) + 1024) {}

  Obj run() {
    while (true) {
      if (at_ >= n_) fail("the pickle ends without STOP");
      const std::size_t start = at_;
      const unsigned char op = p_[at_++];
      switch (op) {
        case 0x80:  // PROTO
          if (take(1)[0] > 5) fail("protocol " + std::to_string(p_[at_ - 1]), start);
          break;
        case 0x95:  // FRAME: a length hint
          take(8);
          break;
        case '.': {  // STOP
          if (stack_.size() != 1 || stack_.back().kind == Obj::Kind::mark)
            fail("STOP with " + std::to_string(stack_.size()) + " values on the stack", start);
          return std::move(stack_.back());
        }
        case '(':  // MARK
          push(Obj{Obj::Kind::mark});
          break;
        case '}':  // EMPTY_DICT
          push(Obj{Obj::Kind::dict});
          break;
        case ']':  // EMPTY_LIST
          push(Obj{Obj::Kind::list});
          break;
        case ')':  // EMPTY_TUPLE
          push(Obj{Obj::Kind::tuple});
          break;
        case 't':  // TUPLE
          push(container(Obj::Kind::tuple, pop_to_mark(start), start));
          break;
        case 'l':  // LIST
          push(container(Obj::Kind::list, pop_to_mark(start), start));
          break;
        case 0x85:    // TUPLE1
        case 0x86:    // TUPLE2
        case 0x87: {  // TUPLE3
          const std::size_t k = static_cast<std::size_t>(op - 0x84);
          if (values_above_mark() < k)
            fail("TUPLE" + std::to_string(k) + " on too few values", start);
          std::vector<Obj> items(std::make_move_iterator(stack_.end() - static_cast<long>(k)),
                                 std::make_move_iterator(stack_.end()));
          stack_.resize(stack_.size() - k);
          push(container(Obj::Kind::tuple, std::move(items), start));
          break;
        }
        case 'a': {  // APPEND
          Obj value = pop(start);
          Obj& list = top(Obj::Kind::list, "APPEND", start);
          add(list, std::move(value), start);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Obj> values = pop_to_mark(start);
          Obj& list = top(Obj::Kind::list, "APPENDS", start);
          for (Obj& v : values) add(list, std::move(v), start);
          break;
        }
        case 's': {  // SETITEM
          Obj value = pop(start), key = pop(start);
          Obj& dict = top(Obj::Kind::dict, "SETITEM", start);
          set_item(dict, std::move(key), std::move(value), start);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Obj> values = pop_to_mark(start);
          if (values.size() % 2 != 0) fail("SETITEMS with an odd number of values", start);
          Obj& dict = top(Obj::Kind::dict, "SETITEMS", start);
          for (std::size_t i = 0; i < values.size(); i += 2)
            set_item(dict, std::move(values[i]), std::move(values[i + 1]), start);
          break;
        }
        case 'q':  // BINPUT
          memo_put(take(1)[0], start);
          break;
        case 'r':  // LONG_BINPUT
          memo_put(little_endian(take(4), 4), start);
          break;
        case 0x94:  // MEMOIZE
          memo_put(memo_.size(), start);
          break;
        case 'h':  // BINGET
          memo_get(take(1)[0], start);
          break;
        case 'j':  // LONG_BINGET
          memo_get(little_endian(take(4), 4), start);
          break;
        case 'X':  // BINUNICODE
          push(string(little_endian(take(4), 4)));
          break;
        case 0x8c:  // SHORT_BINUNICODE
          push(string(take(1)[0]));
          break;
        case 0x8d:  // BINUNICODE8
          push(string(little_endian(take(8), 8)));
          break;
        case 'J':  // BININT
          push(integer(static_cast<std::int32_t>(little_endian(take(4), 4))));
          break;
        case 'K':  // BININT1
          push(integer(take(1)[0]));
          break;
        case 'M':  // BININT2
          push(integer(static_cast<std::int64_t>(little_endian(take(2), 2))));
          break;
        case 0x8a: {  // LONG1: little-endian two's complement of n ≤ 8 bytes
          const std::size_t k = take(1)[0];
          if (k > 8) fail("an integer of " + std::to_string(k) + " bytes", start);
          const unsigned char* v = take(k);
          std::uint64_t u = k > 0 ? little_endian(v, static_cast<int>(k)) : 0;
          if (k > 0 && k < 8 && (v[k - 1] & 0x80)) u |= ~std::uint64_t{0} << (8 * k);
          push(integer(static_cast<std::int64_t>(u)));
          break;
        }
        case 'G': {  // BINFLOAT: big-endian float64
          const unsigned char* v = take(8);
          std::uint64_t u = 0;
          for (int i = 0; i < 8; ++i) u = u << 8 | v[i];
          Obj o{Obj::Kind::real};
          std::memcpy(&o.real, &u, sizeof u);
          push(std::move(o));
          break;
        }
        case 'N':  // NONE
          push(Obj{Obj::Kind::none});
          break;
        case 0x88:    // NEWTRUE
        case 0x89: {  // NEWFALSE
          Obj o{Obj::Kind::boolean};
          o.boolean = op == 0x88;
          push(std::move(o));
          break;
        }
        case 'c': {  // GLOBAL module\nname\n
          const std::string module = line(), name = line();
          push(global(module + "." + name, start));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          Obj name = pop(start), module = pop(start);
          if (name.kind != Obj::Kind::string || module.kind != Obj::Kind::string)
            fail("STACK_GLOBAL without two strings", start);
          push(global(module.string + "." + name.string, start));
          break;
        }
        case 'Q':  // BINPERSID
          push(storage(pop(start), start));
          break;
        case 'R': {  // REDUCE
          Obj args = pop(start), callable = pop(start);
          push(reduce(callable, std::move(args), start));
          break;
        }
        case 'b': {  // BUILD: only an empty state (None or {}) is accepted, and changes nothing
          Obj state = pop(start);
          if (stack_.empty() || stack_.back().kind == Obj::Kind::mark)
            fail("BUILD on an empty stack", start);
          if (state.kind != Obj::Kind::none &&
              !(state.kind == Obj::Kind::dict && state.entries.empty()))
            fail("BUILD with a state (an object torch.save does not write for tensors)", start);
          break;
        }
        default: {
          static const char* hex = "0123456789abcdef";
          fail(std::string("unsupported opcode 0x") + hex[op >> 4] + hex[op & 15], start);
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    refuse("pickle byte " + std::to_string(at_) + ": " + why);
  }
  [[noreturn]] void fail(const std::string& why, std::size_t at) const {
    refuse("pickle byte " + std::to_string(at) + ": " + why);
  }

  const unsigned char* take(std::uint64_t count) {
    if (count > n_ - at_)
      fail(std::to_string(count) + " bytes claimed, " + std::to_string(n_ - at_) + " left");
    const unsigned char* v = p_ + at_;
    at_ += static_cast<std::size_t>(count);
    return v;
  }
  std::string line() {
    const void* newline = std::memchr(p_ + at_, '\n', n_ - at_);
    if (newline == nullptr) fail("a line without its end");
    const auto* e = static_cast<const unsigned char*>(newline);
    std::string s(reinterpret_cast<const char*>(p_ + at_), static_cast<std::size_t>(e - p_ - at_));
    at_ = static_cast<std::size_t>(e - p_) + 1;
    return s;
  }

  void count(const Obj& o, std::size_t at) {
    nodes_ += o.nodes;
    if (nodes_ > max_nodes_)
      fail("more values than a pickle of " + std::to_string(n_) + " bytes can hold", at);
  }
  void push(Obj o) {
    count(o, at_);
    stack_.push_back(std::move(o));
  }
  Obj pop(std::size_t at) {
    if (stack_.empty() || stack_.back().kind == Obj::Kind::mark)
      fail("a pop from an empty stack", at);
    Obj o = std::move(stack_.back());
    stack_.pop_back();
    return o;
  }
  Obj& top(Obj::Kind kind, const char* op, std::size_t at) {
    if (stack_.empty() || stack_.back().kind != kind)
      fail(std::string(op) + " on something else than a " +
               (kind == Obj::Kind::list ? "list" : "dict"),
           at);
    return stack_.back();
  }
  std::size_t values_above_mark() const {
    std::size_t k = 0;
    for (auto it = stack_.rbegin(); it != stack_.rend() && it->kind != Obj::Kind::mark; ++it) ++k;
    return k;
  }
  std::vector<Obj> pop_to_mark(std::size_t at) {
    const std::size_t k = values_above_mark();
    if (k == stack_.size()) fail("no mark", at);
    std::vector<Obj> items(std::make_move_iterator(stack_.end() - static_cast<long>(k)),
                           std::make_move_iterator(stack_.end()));
    stack_.resize(stack_.size() - k - 1);  // and the mark
    return items;
  }
  // Nesting and size are tracked so that neither converting nor destroying recurses deeply.
  Obj container(Obj::Kind kind, std::vector<Obj> items, std::size_t at) const {
    Obj o{kind};
    for (const Obj& i : items) {
      if (i.kind == Obj::Kind::mark) fail("a mark inside a tuple", at);
      o.nodes += i.nodes;
      o.depth = std::max(o.depth, i.depth + 1);
    }
    if (o.depth > kMaxDepth) fail("values nested deeper than " + std::to_string(kMaxDepth), at);
    o.items = std::move(items);
    return o;
  }
  void add(Obj& list, Obj value, std::size_t at) {
    list.nodes += value.nodes;
    list.depth = std::max(list.depth, value.depth + 1);
    if (list.depth > kMaxDepth) fail("values nested deeper than " + std::to_string(kMaxDepth), at);
    list.items.push_back(std::move(value));
  }
  void set_item(Obj& dict, Obj key, Obj value, std::size_t at) {
    dict.nodes += key.nodes + value.nodes;
    dict.depth = std::max({dict.depth, key.depth + 1, value.depth + 1});
    if (dict.depth > kMaxDepth) fail("values nested deeper than " + std::to_string(kMaxDepth), at);
    dict.entries.emplace_back(std::move(key), std::move(value));
  }
  void memo_put(std::uint64_t index, std::size_t at) {
    if (stack_.empty() || stack_.back().kind == Obj::Kind::mark) fail("a memo put of nothing", at);
    if (memo_.size() > n_) fail("more memo entries than pickle bytes", at);
    count(stack_.back(), at);  // a copy, counted like one pushed
    memo_[index] = stack_.back();
  }
  void memo_get(std::uint64_t index, std::size_t at) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail("memo entry " + std::to_string(index) + " never put", at);
    push(it->second);  // a copy, counted: repeated gets cannot blow up unnoticed
  }

  Obj string(std::uint64_t length) {
    Obj o{Obj::Kind::string};
    const unsigned char* s = take(length);
    o.string.assign(reinterpret_cast<const char*>(s), static_cast<std::size_t>(length));
    o.nodes += static_cast<std::int64_t>(length);  // a string weighs its bytes
    return o;
  }
  static Obj integer(std::int64_t v) {
    Obj o{Obj::Kind::integer};
    o.integer = v;
    return o;
  }
  Obj global(const std::string& name, std::size_t at) const {
    if (name != "collections.OrderedDict" && name != "torch._utils._rebuild_tensor_v2" &&
        name != "torch._utils._rebuild_tensor" && !storage_types().count(name))
      fail("unsupported global " + printable(name) +
               " (only tensors, dicts, lists, tuples and scalars)",
           at);
    Obj o{Obj::Kind::global};
    o.string = name;
    return o;
  }

  // ('storage', torch.<Type>Storage, key, location, numel): the record data/<key>, which must
  // hold exactly numel elements.
  Obj storage(const Obj& pid, std::size_t at) {
    const std::vector<Obj>& f = pid.items;
    if (pid.kind != Obj::Kind::tuple || f.size() != 5 || f[0].kind != Obj::Kind::string ||
        f[0].string != "storage" || f[1].kind != Obj::Kind::global ||
        !storage_types().count(f[1].string) || f[2].kind != Obj::Kind::string ||
        f[3].kind != Obj::Kind::string || f[4].kind != Obj::Kind::integer)
      fail("a persistent id other than ('storage', type, key, location, numel)", at);
    Obj o{Obj::Kind::storage};
    o.dtype = storage_types().at(f[1].string);
    o.string = f[2].string;
    o.integer = f[4].integer;
    const auto it = entries_.find(folder_ + "/data/" + o.string);
    if (it == entries_.end()) fail("no entry data/" + printable(o.string) + " for its storage", at);
    const auto item = static_cast<std::int64_t>(c10::elementSize(o.dtype));
    if (o.integer < 0 || static_cast<std::uint64_t>(o.integer) * item != it->second.size ||
        o.integer > static_cast<std::int64_t>(it->second.size))
      fail("storage '" + printable(o.string) + "' claims " + std::to_string(o.integer) +
               " elements of " + std::to_string(item) + " bytes, its entry holds " +
               std::to_string(it->second.size),
           at);
    return o;
  }

  Obj reduce(const Obj& callable, Obj args, std::size_t at) {
    if (callable.kind != Obj::Kind::global || args.kind != Obj::Kind::tuple)
      fail("REDUCE of something else than a global and a tuple", at);
    if (callable.string == "collections.OrderedDict") {
      if (!args.items.empty()) fail("OrderedDict with arguments", at);
      return Obj{Obj::Kind::dict};
    }
    if (callable.string == "torch._utils._rebuild_tensor_v2" ||
        callable.string == "torch._utils._rebuild_tensor")
      return rebuild_tensor(args.items, at);
    fail("a call of " + callable.string, at);
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]): the view
  // of the storage, checked to lie inside it.
  Obj rebuild_tensor(const std::vector<Obj>& a, std::size_t at) {
    if (a.size() < 4 || a[0].kind != Obj::Kind::storage || a[1].kind != Obj::Kind::integer ||
        a[2].kind != Obj::Kind::tuple || a[3].kind != Obj::Kind::tuple ||
        a[2].items.size() != a[3].items.size())
      fail("a tensor other than (storage, offset, size, stride, ...)", at);
    std::vector<std::int64_t> sizes, strides;
    for (std::size_t d = 0; d < a[2].items.size(); ++d) {
      if (a[2].items[d].kind != Obj::Kind::integer || a[3].items[d].kind != Obj::Kind::integer)
        fail("a tensor's size or stride that is not an integer", at);
      sizes.push_back(a[2].items[d].integer);
      strides.push_back(a[3].items[d].integer);
    }
    const Obj& s = a[0];
    // The extreme element offsets of the view, with overflow checks, inside [0, numel).
    std::int64_t lo = a[1].integer, hi = a[1].integer, count = 1;
    bool ok = lo >= 0;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      std::int64_t span = 0;
      ok = ok && sizes[d] >= 0 && !__builtin_mul_overflow(count, sizes[d], &count);
      ok = ok &&
           !__builtin_mul_overflow(std::max<std::int64_t>(sizes[d] - 1, 0), strides[d], &span) &&
           !__builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi);
    }
    if (!ok || (count > 0 && (lo < 0 || hi >= s.integer)))
      fail("a tensor of shape " + shape(sizes) + ", strides " + shape(strides) + ", offset " +
               std::to_string(a[1].integer) + " outside its storage '" + printable(s.string) +
               "' of " + std::to_string(s.integer) + " elements",
           at);
    Obj o{Obj::Kind::tensor};
    o.tensor = storage_tensor(s).as_strided(sizes, strides, count > 0 ? a[1].integer : 0);
    return o;
  }
  // A storage's elements, copied from its entry once per key.
  const at::Tensor& storage_tensor(const Obj& s) {
    auto it = storages_.find(s.string);
    if (it == storages_.end()) {
      at::Tensor t = at::empty({s.integer}, at::TensorOptions().dtype(s.dtype));
      const Entry& e = entries_.at(folder_ + "/data/" + s.string);
      if (e.size > 0) std::memcpy(t.data_ptr(), file_.data() + e.offset, e.size);
      it = storages_.emplace(s.string, t).first;
    }
    return it->second;
  }
  static std::string shape(const std::vector<std::int64_t>& v) {
    std::string s = "[";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  }

  const std::map<std::string, Entry>& entries_;
  const std::string& folder_;
  const std::vector<char>& file_;
  const unsigned char* p_;
  std::size_t n_, at_ = 0;
  std::int64_t nodes_ = 0, max_nodes_;
  std::vector<Obj> stack_;
  std::unordered_map<std::uint64_t, Obj> memo_;
  std::map<std::string, at::Tensor> storages_;
};

PtValue to_value(Obj&& o) {
  PtValue v;
  switch (o.kind) {
    case Obj::Kind::none:
      v.kind = PtValue::Kind::none;
      break;
    case Obj::Kind::boolean:
      v.kind = PtValue::Kind::boolean, v.boolean = o.boolean;
      break;
    case Obj::Kind::integer:
      v.kind = PtValue::Kind::integer, v.integer = o.integer;
      break;
    case Obj::Kind::real:
      v.kind = PtValue::Kind::real, v.real = o.real;
      break;
    case Obj::Kind::string:
      v.kind = PtValue::Kind::string, v.string = std::move(o.string);
      break;
    case Obj::Kind::tuple:
    case Obj::Kind::list:
      v.kind = o.kind == Obj::Kind::tuple ? PtValue::Kind::tuple : PtValue::Kind::list;
      for (Obj& i : o.items) v.items.push_back(to_value(std::move(i)));
      break;
    case Obj::Kind::dict:
      v.kind = PtValue::Kind::dict;
      for (auto& [key, value] : o.entries)
        v.entries.emplace_back(to_value(std::move(key)), to_value(std::move(value)));
      break;
    case Obj::Kind::tensor:
      v.kind = PtValue::Kind::tensor, v.tensor = std::move(o.tensor);
      break;
    case Obj::Kind::mark:
    case Obj::Kind::global:
    case Obj::Kind::storage:
      refuse("the pickle's object holds a bare global, storage or mark");
  }
  return v;
}

}  // namespace

PtValue read_pt_file(const std::vector<char>& bytes) {
  const std::map<std::string, Entry> entries = read_zip(bytes);
  // The archive's folder: that of its <folder>/data.pkl.
  std::string folder;
  for (const auto& [name, entry] : entries) {
    const std::size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash) == "/data.pkl") {
      if (!folder.empty()) refuse("two data.pkl entries");
      folder = name.substr(0, slash);
    }
  }
  if (folder.empty()) refuse("no <folder>/data.pkl entry (not a torch.save file)");
  Unpickler unpickler(entries, folder, bytes, entries.at(folder + "/data.pkl"));
  return to_value(unpickler.run());
}

}  // namespace phasor::cli
