// A store on a (possibly shared) file system. Each key is one file whose name
// is the percent-encoded key; writes go to a temporary file that is renamed
// into place, so a reader sees either no value or a whole one. Mutations take
// an flock(2) on "<dir>/.lock" so that add and compare_set are atomic across
// processes; readers need no lock.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "util/strutil.h"
#include "comms/error.h"
#include "comms/store.h"
#include "store_semantics.h"

namespace comms {
namespace {

using store_semantics::quoted_keys;

// Well below NAME_MAX (255) so the temporary files' suffix fits too.
constexpr size_t kMaxFileNameBytes = 200;

std::string errno_text(int err) { return std::strerror(err); }

// Keeps [A-Za-z0-9_-] and encodes every other byte as %XX. Dots are encoded
// too, so no key can become ".", "..", the lock file or a temporary file.
std::string file_name_for_key(const std::string& key) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string name = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      name.push_back(static_cast<char>(c));
    } else {
      name.push_back('%');
      name.push_back(kHex[c >> 4]);
      name.push_back(kHex[c & 0xf]);
    }
  }
  if (name.size() > kMaxFileNameBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                str::cat("file store: key '", key.substr(0, 64), "...' (", key.size(),
                             " bytes) is too long; its encoded file name would exceed ",
                             kMaxFileNameBytes, " bytes"));
  }
  return name;
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class FileStore final : public Store {
 public:
  using Store::get;
  using Store::wait;

  explicit FileStore(std::string directory) : dir_(std::move(directory)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec || !std::filesystem::is_directory(dir_)) {
      throw Error(ErrorCode::kInvalidArgument,
                  str::cat("file store: cannot create directory '", dir_, "': ",
                               ec ? ec.message() : "not a directory"));
    }
  }

  void set(const std::string& key, const std::string& value) override {
    auto path = path_for(key);
    auto lock = lock_directory("set", key);
    write_atomically(path, value, "set", key);
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto path = path_for(key);
    std::string value;
    poll_until(timeout, [&] { return read_file(path, &value); },
               [&] { return timeout_error("get", {key}, timeout); });
    return value;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::vector<std::string> paths;
    for (const auto& k : keys) paths.push_back(path_for(k));
    poll_until(timeout, [&] { return all_exist(paths); },
               [&] { return timeout_error("wait", keys, timeout); });
  }

  int64_t add(const std::string& key, int64_t delta) override {
    auto path = path_for(key);
    auto lock = lock_directory("add", key);
    int64_t result = store_semantics::added_value(key, read_optional(path), delta);
    write_atomically(path, std::to_string(result), "add", key);
    return result;
  }

  bool check(const std::vector<std::string>& keys) override {
    std::vector<std::string> paths;
    for (const auto& k : keys) paths.push_back(path_for(k));
    return all_exist(paths);
  }

  bool delete_key(const std::string& key) override {
    auto path = path_for(key);
    auto lock = lock_directory("delete_key", key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw io_error("delete_key", key, "unlink", path, errno);
  }

  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    auto path = path_for(key);
    auto lock = lock_directory("compare_set", key);
    auto outcome = store_semantics::compare_set_outcome(read_optional(path), expected, desired);
    if (outcome.swapped) write_atomically(path, *outcome.stored, "compare_set", key);
    return outcome.returned;
  }

 private:
  std::string path_for(const std::string& key) const { return dir_ + "/" + file_name_for_key(key); }

  // A fresh open file description per call: flock excludes other threads of
  // this process as well as other processes.
  FileDescriptor lock_directory(const char* op, const std::string& key) {
    std::string path = dir_ + "/.lock";
    FileDescriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() < 0) throw io_error(op, key, "open", path, errno);
    while (::flock(fd.get(), LOCK_EX) != 0) {
      if (errno != EINTR) throw io_error(op, key, "flock", path, errno);
    }
    return fd;  // closing it releases the lock
  }

  void write_atomically(const std::string& path, const std::string& value, const char* op,
                        const std::string& key) {
    static std::atomic<uint64_t> counter{0};
    std::string tmp = str::cat(dir_, "/.tmp.", ::getpid(), ".", counter.fetch_add(1));
    {
      FileDescriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (fd.get() < 0) throw io_error(op, key, "open", tmp, errno);
      size_t written = 0;
      while (written < value.size()) {
        ssize_t n = ::write(fd.get(), value.data() + written, value.size() - written);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          int err = errno;
          ::unlink(tmp.c_str());
          throw io_error(op, key, "write", tmp, err);
        }
        written += static_cast<size_t>(n);
      }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      throw io_error(op, key, "rename", path, err);
    }
  }

  // False when the file does not exist; throws on any other failure.
  bool read_file(const std::string& path, std::string* out) const {
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return false;
      throw io_error("get", path, "open", path, errno);
    }
    out->clear();
    char buffer[64 * 1024];
    while (true) {
      ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw io_error("get", path, "read", path, errno);
      if (n == 0) return true;
      out->append(buffer, static_cast<size_t>(n));
    }
  }

  std::optional<std::string> read_optional(const std::string& path) const {
    std::string value;
    if (!read_file(path, &value)) return std::nullopt;
    return value;
  }

  static bool all_exist(const std::vector<std::string>& paths) {
    for (const auto& p : paths) {
      struct stat st;
      if (::stat(p.c_str(), &st) != 0) return false;
    }
    return true;
  }

  // Polls with a back-off from 1 ms to 20 ms: other processes give no signal.
  template <typename Ready, typename MakeError>
  static void poll_until(std::chrono::milliseconds timeout, Ready ready, MakeError make_error) {
    auto deadline = store_semantics::deadline_after(timeout);
    auto pause = std::chrono::milliseconds(1);
    while (!ready()) {
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) throw make_error();
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
  }

  Error timeout_error(const char* op, const std::vector<std::string>& keys,
                      std::chrono::milliseconds timeout) const {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!all_exist({path_for(k)})) missing.push_back(k);
    }
    return Error(ErrorCode::kTimeout,
                 str::cat(op, "(", quoted_keys(keys), ") on the file store at '", dir_,
                              "' timed out after ", timeout.count(), " ms; missing: ", quoted_keys(missing)));
  }

  Error io_error(const char* op, const std::string& key, const char* call, const std::string& path,
                 int err) const {
    return Error(ErrorCode::kInternal, str::cat(op, "('", key, "') on the file store at '", dir_,
                                                    "': ", call, "(", path, ") failed: ", errno_text(err)));
  }

  std::string dir_;
};

}  // namespace

std::shared_ptr<Store> make_file_store(const std::string& directory) {
  if (directory.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "make_file_store: the directory is empty");
  }
  return std::make_shared<FileStore>(directory);
}

}  // namespace comms
