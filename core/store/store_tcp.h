// Internal accessors of the TCP store that the public API does not expose.
#pragma once

#include <string>

#include "comms/store.h"

namespace comms {

// The local IP address of `store`'s connection to its TCP store server (the
// address this process uses to reach the others; Gloo binds it by default),
// or "" when `store` is not a TCP store client. Prefix stores are looked
// through, since comms hand their backends a prefixed view of the TCP store.
std::string tcp_store_local_address(const Store& store);

// The store under a prefix store, or nullptr when `store` is not one
// (defined with the prefix store in store_memory.cc).
const Store* prefix_store_base(const Store& store);

}  // namespace comms
