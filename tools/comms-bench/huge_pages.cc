#include "huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <utility>

namespace comms::bench {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;

}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes) : bytes_(bytes) {
  mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Map one huge page more than needed and keep the aligned part: the
  // kernel backs a range with huge pages only where it is 2 MiB-aligned.
  const size_t extra = mapped_ + kHugePage;
  void* raw = mmap(nullptr, extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  auto* base = static_cast<uint8_t*>(raw);
  auto* aligned = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) / kHugePage *
                                             kHugePage);
  if (aligned > base) munmap(base, static_cast<size_t>(aligned - base));
  if (const size_t tail = static_cast<size_t>(base + extra - (aligned + mapped_))) munmap(aligned + mapped_, tail);
  data_ = aligned;
  madvise(data_, mapped_, MADV_HUGEPAGE);  // advice: THP set to never leaves 4 KiB pages (huge_bytes says so)
  std::memset(data_, 0, mapped_);          // faulted in now, not in a timed iteration
}

HugePageBuffer::~HugePageBuffer() { reset(); }

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

void HugePageBuffer::reset() noexcept {
  if (data_) munmap(data_, mapped_);
  data_ = nullptr;
  bytes_ = mapped_ = 0;
}

size_t HugePageBuffer::huge_bytes() const {
  if (!data_) return 0;
  // A mapping's smaps entry starts "lo-hi perms ..."; its AnonHugePages line
  // follows. Neighbouring mappings with the same flags may be merged with
  // this one, so the count is of the entry holding data_, capped at mapped_.
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(data_);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    const size_t dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && line.find(' ') > dash && std::isxdigit(line[0])) {
      const uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const uintptr_t hi = std::stoull(line.substr(dash + 1), nullptr, 16);
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      const size_t kb = std::stoull(line.substr(std::strlen("AnonHugePages:")));
      return std::min(kb * 1024, mapped_);
    }
  }
  return 0;
}

}  // namespace comms::bench
