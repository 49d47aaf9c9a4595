// --huge-pages: CPU memory in transparent huge pages (2 MiB-aligned anonymous
// memory advised MADV_HUGEPAGE), as torch gives tensors of 2 MiB and more
// with THP_MEM_ALLOC_ENABLE=1. A kernel copy between processes (UCX's
// cross-memory attach) pins each page it touches, so 2 MiB pages make it
// cheaper per byte than 4 KiB ones; the benchmark shows both.
#pragma once

#include <cstddef>
#include <cstdint>

namespace comms::bench {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // Zeroed and touched; throws std::bad_alloc when the kernel refuses.
  explicit HugePageBuffer(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  // The bytes of this buffer the kernel backs with huge pages now
  // (/proc/self/smaps), for a warning when THP is off or memory fragmented.
  size_t huge_bytes() const;

 private:
  void reset() noexcept;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0, mapped_ = 0;
};

}  // namespace comms::bench
