// Key-value stores for rendezvous: a TCP store (server hosted by the launcher
// or by rank 0), a file store for shared file systems, an in-process store for
// single-process jobs, and a prefix store that gives each comm its namespace.
//
// Values are byte strings. Every blocking call takes a timeout and throws
// comms::Error(kTimeout) when it passes; a lost server gives kPeerFailure.
// All stores are safe to use from several threads, and a get or wait blocked
// on one thread does not hold up another thread's calls on the same store
// (the TCP client opens a spare connection for them).
#pragma once

#include "comms/export.h"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace comms {

class COMMS_API Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until the key exists, then returns its value.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Adds `delta` to the integer stored at key (missing counts as 0) and
  // returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns whether the key existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Sets key to `desired` if its value is `expected` (a missing key matches
  // an empty `expected`). Returns the value after the call: `desired` when it
  // was swapped, else the current value (`expected` when the key is missing).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;

  // The timeout used by callers that have none of their own.
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  void set_default_timeout(std::chrono::milliseconds t) { default_timeout_ = t; }

  std::string get(const std::string& key) { return get(key, default_timeout_); }
  void wait(const std::vector<std::string>& keys) { wait(keys, default_timeout_); }

 protected:
  std::chrono::milliseconds default_timeout_{std::chrono::minutes(5)};
};

// Connects to a TcpStoreServer, retrying the connection until `connect_timeout`
// passes (the server may start after the client). Throws kTimeout.
//
// Client and server prove to each other that they hold the same token
// (challenge-response; the token never crosses the wire). This overload
// takes it from COMMS_STORE_TOKEN, or the file named by
// COMMS_STORE_TOKEN_FILE, and uses none when both are unset. A server that
// refuses the client, or a server that cannot prove the token, is an
// Error(kInvalidArgument) naming the store's address and the reason.
COMMS_API std::shared_ptr<Store> connect_tcp_store(const std::string& host, uint16_t port,
                                         std::chrono::milliseconds connect_timeout);
// The same with an explicit token ("": none).
COMMS_API std::shared_ptr<Store> connect_tcp_store(const std::string& host, uint16_t port,
                                         std::chrono::milliseconds connect_timeout,
                                         const std::string& token);

// How a TcpStoreServer protects itself from clients that hold connections,
// memory or descriptors without doing useful work.
struct TcpStoreServerOptions {
  static constexpr size_t kDefaultMaxFrameBytes = 64u << 20;

  // Largest request frame; a larger one closes that connection. The body of
  // a frame is allocated as its bytes arrive, never from its header alone.
  size_t max_frame_bytes = kDefaultMaxFrameBytes;
  // The shared secret every client must prove before any request is served.
  // nullopt: COMMS_STORE_TOKEN or COMMS_STORE_TOKEN_FILE (none when both are
  // unset); "": no authentication.
  std::optional<std::string> token;
  // A connection must finish its handshake this soon after it was accepted.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(10)};
  // A frame, once its first byte arrived, must be complete this soon, and a
  // reply must be taken by the client this soon. A client between requests
  // (or blocked in get/wait) may stay idle for as long as it likes.
  std::chrono::milliseconds frame_timeout{std::chrono::seconds(30)};
  // Open connections from one client address; more are closed at once.
  size_t max_connections_per_address = 1024;
  // Connections from one address still in their handshake; a new one beyond
  // this closes the oldest of them.
  size_t max_handshakes_per_address = 64;
};

// The server side of the TCP store. It runs on its own thread until destroyed.
// Frames larger than max_frame_bytes, or malformed, close that connection with
// an error logged; the server keeps serving everyone else. Every socket it
// opens is close-on-exec. Without a token on an address other than loopback,
// it logs a warning that anyone who can reach it can read and write keys.
class COMMS_API TcpStoreServer {
 public:
  static constexpr size_t kDefaultMaxFrameBytes = TcpStoreServerOptions::kDefaultMaxFrameBytes;

  // Binds `host` ("127.0.0.1", "0.0.0.0", "::1", a name) at `port` (0 picks a
  // free one), and only that address. Throws comms::Error on failure. The
  // token comes from the environment (see TcpStoreServerOptions::token).
  TcpStoreServer(const std::string& host, uint16_t port,
                 size_t max_frame_bytes = kDefaultMaxFrameBytes);
  TcpStoreServer(const std::string& host, uint16_t port, const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const;
  const std::string& host() const;
  size_t key_count() const;
  // Client connections open right now (handshaking or authenticated).
  size_t connection_count() const;
  // Whether clients must prove a token.
  bool requires_token() const;

 private:
  class COMMS_LOCAL Impl;
  std::unique_ptr<Impl> impl_;
};

// A store on a shared file system: one file per key under `directory`, which
// is created if missing. Waits poll with a short back-off.
COMMS_API std::shared_ptr<Store> make_file_store(const std::string& directory);

// A store living in this process, for single-process jobs and tests.
COMMS_API std::shared_ptr<Store> make_memory_store();

// Prefixes every key with "<prefix>/" on `base`.
COMMS_API std::shared_ptr<Store> make_prefix_store(const std::string& prefix, std::shared_ptr<Store> base);

}  // namespace comms
