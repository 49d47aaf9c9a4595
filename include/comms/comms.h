// Everything a trainer needs: #include <comms/comms.h>.
#pragma once

#include "comms/export.h"

#include "comms/backend_spec.h"
#include "comms/bootstrap.h"
#include "comms/comm.h"
#include "comms/dist.h"
#include "comms/elastic.h"
#include "comms/lifecycle.h"
#include "comms/parallel.h"
#include "comms/registration.h"
#include "comms/window.h"
#include "comms/error.h"
#include "comms/info.h"
#include "comms/options.h"
#include "comms/store.h"
#include "comms/trace.h"
#include "comms/types.h"
#include "comms/work.h"

namespace comms {
// The version of this libcomms, e.g. "0.1.0".
COMMS_API const char* library_version();
}  // namespace comms
