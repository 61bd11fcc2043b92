// ctxplan's exit codes (documented in --help and the README).
#pragma once

namespace ctx {
constexpr int kExitOk = 0;          // success; for predict: the plan fits
constexpr int kExitInternal = 1;    // a bug: please report it
constexpr int kExitBadInput = 2;    // bad input: file, field and what would be valid are printed
constexpr int kExitDoesNotFit = 3;  // predict: the plan does not fit device or host memory
constexpr int kExitOverTolerance = 4;  // compare --fail-over-tol: a judged row is over its tolerance
}  // namespace ctx
