// The one guarded way core calls into a plugin, and the one formatter of the
// "comms[name rank r/s]" prefix that every message about a comm starts with.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "comms/error.h"
#include "util/strutil.h"

namespace comms::internal {

// "comms[name rank r/s]".
std::string comm_prefix(std::string_view name, int rank, int size);

// Calls one plugin function (a descriptor entry or a Backend method, wrapped
// in `f`, which returns a Status) so that a faulty plugin gives an error, not
// a crash: an exception becomes kInternal naming the plugin and function.
template <class F>
Status call_plugin(std::string_view plugin, std::string_view function, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, str::cat(plugin, " threw from ", function, "(): ", e.what())};
  } catch (...) {
    return {ErrorCode::kInternal, str::cat(plugin, " threw a non-standard exception from ", function, "()")};
  }
}

// The same for a function that hands back an object: an ok status that left
// `result` null is kInternal as well (the caller would dereference it).
template <class F, class T>
Status call_plugin(std::string_view plugin, std::string_view function, F&& f,
                   const std::unique_ptr<T>& result, std::string_view result_what) {
  Status st = call_plugin(plugin, function, std::forward<F>(f));
  if (st.is_ok() && !result) {
    st = {ErrorCode::kInternal, str::cat(plugin, " returned ok from ", function, "() but no ", result_what)};
  }
  return st;
}

}  // namespace comms::internal
