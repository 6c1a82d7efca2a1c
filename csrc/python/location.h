// Python source locations of recorded ops (see SourceLocation in lazy/queue.h).
#pragma once

namespace tpu_eager {

// Installs the hooks that give each recorded op the Python line recording it.
void install_python_location_hooks();

}  // namespace tpu_eager
