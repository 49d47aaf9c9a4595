// comms::new_comm: the comm's config from its arguments, the launcher's
// environment and the COMMS_* variables, then its backends.
#include "comm/comm_impl.h"
#include "bootstrap/local_placement.h"
#include "comms/store.h"
#include "config/env.h"
#include "util/log.h"
#include "store/store_tcp.h"
#include "util/strutil.h"

namespace comms {

namespace {

constexpr auto kDefaultInitTimeout = std::chrono::minutes(5);
constexpr auto kDefaultOpTimeout = std::chrono::minutes(10);

std::chrono::milliseconds timeout_from(std::optional<std::chrono::milliseconds> given,
                                       const char* variable, std::chrono::milliseconds fallback) {
  if (given) {
    if (given->count() <= 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("timeout must be positive; got ", given->count(), " ms"));
    }
    return *given;
  }
  if (auto v = env::get(variable)) return env::parse_duration(*v, variable);
  return fallback;
}

std::shared_ptr<Comm> create_comm(const std::string& backend, std::optional<Device> device,
                                  const std::string& name, const CommOptions& options, int* rank);

}  // namespace

std::shared_ptr<Comm> new_comm(const std::string& backend, std::optional<Device> device,
                               const std::string& name, const CommOptions& options) {
  int rank = options.rank.value_or(-1);
  try {
    return create_comm(backend, device, name, options, &rank);
  } catch (const Error& e) {
    if (!e.comm().empty()) throw;
    // Errors of the checks above the comm (bootstrap, hints, timeouts) get
    // the comm's name, the op and the rank, as every comms::Error has.
    throw Error(e.code(), e.what(), name, "new_comm", 0, rank, e.peer());
  }
}

namespace {

std::shared_ptr<Comm> create_comm(const std::string& backend, std::optional<Device> device,
                                  const std::string& name, const CommOptions& options, int* rank) {
  if (name.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "new_comm: a comm needs a name (it keys its rendezvous)");
  }
  if (options.rank.has_value() != options.world_size.has_value()) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("new_comm '", name, "': set both rank and world_size, or neither"));
  }
  log::level_from_environment();  // a malformed COMMS_LOG_LEVEL is an error here
  Comm::Impl::Config c;
  c.name = name;
  if (options.rank) {
    // The caller's rank and size: the launcher's variables only place this process on its host.
    c.rank = *options.rank;
    c.size = *options.world_size;
  } else {
    const BootstrapInfo boot = bootstrap_from_environment();
    c.rank = boot.rank;
    c.size = boot.world_size;
    c.local_rank = boot.local_rank;
    c.local_size = boot.local_world_size;
  }
  *rank = c.rank;
  if (c.size < 1 || c.rank < 0 || c.rank >= c.size) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("new_comm '", name, "': rank ", c.rank, " is not in [0, ", c.size, ")"));
  }
  if (options.rank) {
    const auto placement = internal::local_placement_from_environment(c.rank, c.size);
    c.local_rank = placement.local_rank;
    c.local_size = placement.local_size;
  }
  if (!backend.empty()) {
    c.spec = BackendSpec::parse(backend);
  } else if (auto from_env = env::get("COMMS_BACKEND")) {
    try {
      c.spec = BackendSpec::parse(*from_env);
    } catch (const Error& e) {
      throw Error(e.code(), str::cat("COMMS_BACKEND='", *from_env, "': ", e.what()));
    }
  } else {
    c.spec = BackendSpec::parse("");
  }
  if (device) {
    if (!c.spec.has(device->type)) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("new_comm '", name, "': device ", device->to_string(),
                               " was given but backend string '", c.spec.to_string(),
                               "' has no backend for ", to_string(device->type)));
    }
    c.bound_device = device;
  }
  c.init_timeout = timeout_from(options.init_timeout, "COMMS_INIT_TIMEOUT", kDefaultInitTimeout);
  c.op_timeout = timeout_from(options.op_timeout, "COMMS_OP_TIMEOUT", kDefaultOpTimeout);
  // Used only by a recovery, read here: a malformed value fails now, not then.
  env::get_duration("COMMS_ELASTIC_LIVENESS_TIMEOUT");
  c.hints = options.hints;
  c.abort_process_on_error = options.abort_process_on_error;
  c.elastic = options.elastic ? *options.elastic : env::get_bool("COMMS_ELASTIC", false);
  c.store = options.store ? options.store : default_store(c.rank, c.size, c.init_timeout);
  c.store_local_address = tcp_store_local_address(*c.store);
  const std::string ns_base = str::cat("comms/", name);
  c.rendezvous_ns = str::cat(ns_base, "/i", internal::next_incarnation(ns_base));

  internal::register_comm_name(name);
  auto impl = std::make_shared<Comm::Impl>(c);
  try {
    impl->create_backends();
  } catch (...) {
    try {
      impl->finalize();
    } catch (const std::exception& e) {
      log::error(str::cat("cleaning up after a failed new_comm '", name, "': ", e.what()));
    }
    throw;
  }
  return std::make_shared<Comm>(impl);
}

}  // namespace

}  // namespace comms
