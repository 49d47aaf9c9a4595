// What libcomms exports. The library is built with hidden visibility, so only
// declarations marked COMMS_API are part of its ABI; internals
// (comms::internal, comms::str, ...) stay inside it.
#pragma once

#define COMMS_API __attribute__((visibility("default")))
// For what an exported class declares but keeps to itself (its Impl).
#define COMMS_LOCAL __attribute__((visibility("hidden")))
