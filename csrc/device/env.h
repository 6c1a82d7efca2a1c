// The one registry of the environment knobs of torch_tpu_eager (DESIGN §7).
//
// Every TORCH_TPU_* variable the extension, its Python package, its examples,
// benchmarks, tests or its build read is declared here once with its type,
// default and meaning; `python -m torch_tpu_eager.env` prints the table with the
// current values. C++ reads a knob only through the getters below, which parse
// one convention per type and raise c10::ValueError (Python ValueError) naming
// the variable for a malformed value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tpu_eager {
namespace env {

enum class KnobType { kBool, kInt, kString, kPath };

struct Knob {
  const char* name;
  KnobType type;
  const char* default_value;  // as it would be written in the environment; "" = unset
  const char* where;          // who reads it: "runtime", "python", "build", "tests", "examples"
  const char* doc;
};

// Every knob, in the order the report prints them.
const std::vector<Knob>& knobs();

// The raw value of a declared knob (nullopt when unset or empty). Raises
// c10::Error if `name` is not in the registry: an undeclared knob is a bug.
std::optional<std::string> raw(const char* name);

// Parsed values: bool accepts exactly "0" or "1"; int a decimal integer >= 0
// that fits int64 (an optional K/M/G suffix multiplies by 2^10, 2^20, 2^30).
// Unset or empty gives the registry's default. A malformed value raises
// c10::ValueError naming the variable, its value and what was expected.
bool get_bool(const char* name);
int64_t get_int(const char* name);
std::string get_string(const char* name);  // kString and kPath knobs

// Parses every knob that is set; raises on the first malformed one. Called
// once at `import torch_tpu_eager`, so a typo fails at import, not mid-run.
void validate_all();

}  // namespace env
}  // namespace tpu_eager
