#include "host_shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace comms::ucx_backend::host_shared {
namespace {

struct Allocation {
  size_t bytes = 0;  // as mapped: whole pages
  int fd = -1;
  uint64_t inode = 0;
};

// Keyed by base address; one mutex for the few calls that are not per op.
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Allocation> by_base;
};

std::atomic<uint64_t> released{0};

Registry& registry() {
  static Registry* r = new Registry;  // outlives every static destructor that may free into it
  return *r;
}

std::string errno_text(const std::string& call) { return call + " failed: " + std::strerror(errno); }

size_t whole_pages(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

Status allocate(size_t bytes, void** ptr) {
  if (bytes == 0) return {ErrorCode::kInvalidArgument, "alloc_backend_memory: 0 bytes"};
  const size_t mapped = whole_pages(bytes);
  const int fd = memfd_create("comms-ucx", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return {ErrorCode::kInternal, errno_text("memfd_create")};
  struct stat st {};
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 || fstat(fd, &st) != 0) {
    Status s{ErrorCode::kInternal, errno_text("sizing and sealing the memfd")};
    close(fd);
    return s;
  }
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    Status s{ErrorCode::kInternal, errno_text("mmap of " + std::to_string(mapped) + " bytes")};
    close(fd);
    return s;
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.by_base[reinterpret_cast<uintptr_t>(base)] = {mapped, fd, static_cast<uint64_t>(st.st_ino)};
  *ptr = base;
  return {};
}

Status release(void* ptr) {
  Allocation a;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_base.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == r.by_base.end()) {
      return {ErrorCode::kInvalidArgument,
              "free_backend_memory: the pointer is not the start of memory from alloc_backend_memory on cpu:ucx"};
    }
    a = it->second;
    r.by_base.erase(it);
  }
  released.fetch_add(1, std::memory_order_relaxed);
  // Peers' mappings keep the pages alive until they unmap; nothing of this
  // process refers to them any more.
  const bool unmapped = munmap(ptr, a.bytes) == 0;
  const std::string why = unmapped ? "" : errno_text("munmap");
  const bool closed = close(a.fd) == 0;
  if (!unmapped) return {ErrorCode::kInternal, "free_backend_memory: " + why};
  if (!closed) return {ErrorCode::kInternal, "free_backend_memory: " + errno_text("close of the memfd")};
  return {};
}

std::optional<Location> find(const void* data, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(data);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_base.upper_bound(at);
  if (it == r.by_base.begin()) return std::nullopt;
  --it;
  const size_t offset = at - it->first;
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) return std::nullopt;
  return Location{it->second.fd, it->second.inode, it->second.bytes, offset};
}

size_t live_allocations() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.by_base.size();
}

uint64_t releases() { return released.load(std::memory_order_relaxed); }

void* map_peer(int pid, const Location& where, std::string* why_not) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(where.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *why_not = errno_text("open " + path);
    return nullptr;
  }
  struct stat st {};
  void* base = nullptr;
  if (fstat(fd, &st) != 0) {
    *why_not = errno_text("fstat");
  } else if (static_cast<uint64_t>(st.st_ino) != where.inode || static_cast<size_t>(st.st_size) != where.alloc_bytes) {
    *why_not = path + " is no longer the allocation the peer published (freed since?)";
  } else {
    base = mmap(nullptr, where.alloc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      *why_not = errno_text("mmap of the peer's allocation");
      base = nullptr;
    }
  }
  close(fd);  // the mapping keeps the memory
  return base;
}

void unmap_peer(void* base, size_t alloc_bytes) {
  if (base) munmap(base, alloc_bytes);
}

}  // namespace comms::ucx_backend::host_shared
