// What every fuzz target asserts besides "no crash, no sanitizer report": a
// failed property prints what was expected and aborts, which libFuzzer
// records as a crash with its reproducer.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "comms/error.h"

namespace fuzz {

[[noreturn]] inline void fail(const char* file, int line, const char* what, const std::string& detail) {
  std::fprintf(stderr, "\n%s:%d: property failed: %s\n  %s\n", file, line, what, detail.c_str());
  std::fflush(stderr);
  std::abort();
}

// Runs `parse`; an input may be rejected only with comms::Error of one of the
// accepted codes and a message that names the input (`must_mention`, when
// not empty). Any other exception, or another code, fails the run. Returns
// whether `parse` succeeded.
template <class F>
bool accepts(F&& parse, std::initializer_list<comms::ErrorCode> codes, std::string_view must_mention,
             const char* file, int line) {
  try {
    parse();
    return true;
  } catch (const comms::Error& e) {
    bool code_ok = false;
    for (auto c : codes) code_ok = code_ok || e.code() == c;
    if (!code_ok) {
      fail(file, line, "rejected with an unexpected error code",
           std::string(comms::to_string(e.code())) + ": " + e.what());
    }
    if (std::string_view(e.what()).empty()) fail(file, line, "rejected with an empty message", "");
    // what() is a C string, cut at the first NUL: only NUL-free input can be checked.
    if (!must_mention.empty() && must_mention.find('\0') == std::string_view::npos && std::string_view(e.what()).find(must_mention) == std::string_view::npos) {
      fail(file, line, "the error does not name the input",
           std::string("input '") + std::string(must_mention) + "', message: " + e.what());
    }
    return false;
  } catch (const std::exception& e) {
    fail(file, line, "threw something other than comms::Error", e.what());
  } catch (...) {
    fail(file, line, "threw something other than comms::Error", "(not a std::exception)");
  }
}

}  // namespace fuzz

#define FUZZ_CHECK(cond, detail) \
  do {                           \
    if (!(cond)) ::fuzz::fail(__FILE__, __LINE__, #cond, (detail)); \
  } while (0)

// fuzz::accepts([&] { ... }, {codes}, mention, FUZZ_HERE)
#define FUZZ_HERE __FILE__, __LINE__
