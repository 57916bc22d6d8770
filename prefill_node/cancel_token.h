// CancelToken moved to common/util (the shared job queue uses it); this name stays for its users.
#pragma once

#include "common/util/cancel_token.h"
