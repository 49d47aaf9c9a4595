// Small string helpers. Debian's Abseil (2022) has its own string_view type
// that std::string_view does not convert to, so the library uses these
// instead of absl::StrCat and friends.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace comms::str {

inline void append_one(std::string& out, std::string_view s) { out.append(s); }
inline void append_one(std::string& out, const char* s) { out.append(s ? s : "(null)"); }
inline void append_one(std::string& out, char c) { out.push_back(c); }
template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, char> && !std::is_same_v<T, bool>)
void append_one(std::string& out, T v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}
template <class T>
  requires std::is_floating_point_v<T>
void append_one(std::string& out, T v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

template <class... Args>
std::string cat(const Args&... args) {
  std::string out;
  (append_one(out, args), ...);
  return out;
}

template <class... Args>
void append(std::string& out, const Args&... args) {
  (append_one(out, args), ...);
}

template <class Range>
std::string join(const Range& items, std::string_view separator) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out.append(separator);
    first = false;
    append_one(out, item);
  }
  return out;
}

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

inline std::string_view strip(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// A temporary std::string passed where a view is kept would die first (a
// range-for over split(lower(x)) does not extend it), so these do not compile.
template <class T>
concept TemporaryString = std::is_same_v<T, std::string>;  // deduced from T&&: an rvalue
template <TemporaryString T>
std::string_view strip(T&& s) = delete;

inline std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

inline std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

// Splits on `sep`. With skip_blank, items that are empty or only whitespace
// are dropped. The parts view `s`: keep what they point into alive.
inline std::vector<std::string_view> split(std::string_view s, char sep, bool skip_blank = false) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    std::string_view item = s.substr(start, end == std::string_view::npos ? s.npos : end - start);
    if (!skip_blank || !strip(item).empty()) parts.push_back(item);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

template <TemporaryString T>
std::vector<std::string_view> split(T&& s, char sep, bool skip_blank = false) = delete;

inline bool consume_prefix(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

inline bool consume_suffix(std::string_view& s, std::string_view suffix) {
  if (!s.ends_with(suffix)) return false;
  s.remove_suffix(suffix.size());
  return true;
}

// Whole-string integer parse (surrounding whitespace allowed).
template <class T>
bool parse_int(std::string_view s, T* out) {
  s = strip(s);
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (s.starts_with('-')) return false;  // from_chars would read "+-1" as -1
  }
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

inline bool parse_double(std::string_view s, double* out) {
  s = strip(s);
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (s.starts_with('-')) return false;  // from_chars would read "+-1" as -1
  }
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

inline std::string hex(uint64_t v, int width = 16) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(static_cast<size_t>(width), '0');
  for (int i = width - 1; i >= 0 && v; --i, v >>= 4) out[static_cast<size_t>(i)] = kDigits[v & 15];
  return out;
}

}  // namespace comms::str
