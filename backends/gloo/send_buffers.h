// Sizes the kernel send buffers of a Gloo job's two meshes before any op.
//
// Gloo sets a pair's SO_SNDBUF to the size of any message that outgrows the
// buffer it knows of, so the first message fixes it, and setting it turns
// off the kernel's autotuning. A tiny first message (an 8-byte broadcast, an
// unbound buffer's ready notification) leaves a ~4.6 KiB buffer, and every
// later message near that size waits for the peer's delayed ACK: 8-44 ms per
// 4 KiB all_reduce on a 2-core machine. Exchanging one message of the
// sync path's largest size on every pair sizes the buffers first.
#pragma once

#include <chrono>

#include <gloo/context.h>

namespace comms::gloo_backend {

// Collective over the job: every rank calls it once, right after connecting
// both meshes (the sync mesh's pairs already in sync mode). Throws Gloo's
// exceptions on failure.
void size_send_buffers(::gloo::Context& sync_mesh, ::gloo::Context& async_mesh, std::chrono::milliseconds timeout);

}  // namespace comms::gloo_backend
