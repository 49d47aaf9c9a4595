// Host-shared memory: what comms::alloc_backend_memory gives on cpu:ucx.
// Each allocation is a memfd (memfd_create) mapped MAP_SHARED, so that
// another process of this host can map the same pages and a window put or a
// collective becomes a plain memcpy, with no kernel copy and no bounce.
//
// How a peer maps it: it opens /proc/<owner pid>/fd/<fd>, which reopens the
// owner's memfd. The kernel allows that to a process of the same uid that
// may ptrace-read the owner; cross-memory attach (process_vm_writev), which
// the UCX backend already needs on one host, asks for more (ptrace-attach),
// so wherever direct copies work this works too, without a socket to pass
// descriptors over. The descriptor number alone could name a newer file
// once the owner freed and reused it: the peer checks the inode the owner
// published, and the size. The memfd is sealed against shrinking, so a
// peer's mapping can never turn into SIGBUS under it.
//
// The registry is process-wide (the plugin is never unloaded): it says
// whether a buffer lies inside one allocation, and where.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "comms/error.h"

namespace comms::ucx_backend::host_shared {

// A buffer's place in an allocation of this process.
struct Location {
  int fd = -1;            // the owner's memfd
  uint64_t inode = 0;     // of that memfd
  size_t alloc_bytes = 0;  // the whole allocation, as mapped
  size_t offset = 0;       // of the buffer from the allocation's start
};

// `bytes` (> 0) of zeroed host-shared memory; kInvalidArgument for 0,
// kInternal (naming the call and errno) when the kernel refuses.
Status allocate(size_t bytes, void** ptr);
// Unmaps and closes an allocation made by allocate(); kInvalidArgument for
// any other pointer (nothing is touched then).
Status release(void* ptr);
// Where [data, data + bytes) lies, when all of it is inside one allocation.
std::optional<Location> find(const void* data, size_t bytes);
// Allocations live in this process.
size_t live_allocations();
// Allocations this process has released so far. A peer that caches
// mappings of this process's memory drops them once it sees this move, so
// that freed memory is not kept alive by its mappings.
uint64_t releases();

// Maps a peer's allocation (pid: the owner, on this host). Returns its
// base, or null with *why_not saying why (the peer's process is gone, the
// descriptor now names another file, permissions). Release with unmap_peer.
void* map_peer(int pid, const Location& where, std::string* why_not);
void unmap_peer(void* base, size_t alloc_bytes);

}  // namespace comms::ucx_backend::host_shared
