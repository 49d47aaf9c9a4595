// Checks a bind address before Gloo sees it. Gloo's CreateDevice does not
// check getaddrinfo's result (a host name that does not resolve crashes it)
// and throws bare enforce messages for the rest, so every host name and
// interface is checked here first, the way Gloo will use it.
#pragma once

#include <string>

#include "comms/error.h"

namespace comms::gloo_backend {

// `source` names where the value came from, for messages: e.g.
// "COMMS_GLOO_HOSTNAME" or "hint gloo.hostname".

// A host name or address Gloo can bind: it resolves (as Gloo resolves it:
// getaddrinfo, any family, stream sockets), one of its addresses can be bound
// on this host, and that address belongs to an interface (Gloo looks the
// interface up by address).
Status check_hostname(const std::string& hostname, const std::string& source);

// An interface Gloo can bind: it exists and has an IPv4 or IPv6 address.
Status check_interface(const std::string& interface, const std::string& source);

}  // namespace comms::gloo_backend
