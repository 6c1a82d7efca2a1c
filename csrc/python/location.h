// Python source locations of recorded ops (see SourceLocation in lazy/queue.h).
#pragma once

#include <string>
#include <vector>

namespace tpu_eager {

// Installs the hooks that give each recorded op the Python line recording it.
void install_python_location_hooks();

// Files whose path starts with one of `prefixes` (torch's and this package's
// directories), or with `stdlib` outside its site-packages, are library code:
// an op recorded there is reported at the innermost frame outside them. Set
// once at import, before any op is recorded (verdicts are cached per code object).
void set_library_paths(const std::vector<std::string>& prefixes, const std::string& stdlib);

}  // namespace tpu_eager
