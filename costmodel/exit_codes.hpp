// Exit codes of every binary: ctxplan, ctxplan-gui, ctxrun, ctxrun-calibrate. One meaning per code
// across all of them (documented in --help and the README); a binary uses the codes that apply to it.
//
//   code  name                 meaning                                                  used by
//   0     kExitOk              success; predict/plan/launch: the plan fits               all
//   1     kExitInternal        a bug (please report it); ctxrun: a rank failed           all
//   2     kExitBadInput        bad input: file or flag, field and valid values printed  all
//   3     kExitDoesNotFit      the plan does not fit device or host memory              ctxplan, ctxrun
//   4     kExitOverTolerance   compare --fail-over-tol: a judged row over its tolerance ctxplan compare
//   5     kExitNoDevice        no CUDA device (or driver) to run on                     ctxrun-calibrate
//   6     kExitDiverged        training diverged (non-finite loss or gradients)         ctxrun
//   130   kExitInterrupted     interrupted by SIGINT (128 + 2, the shell's convention)  ctxplan plan/sweep, ctxrun
#pragma once

namespace ctx {
constexpr int kExitOk = 0;
constexpr int kExitInternal = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitDoesNotFit = 3;
constexpr int kExitOverTolerance = 4;
constexpr int kExitNoDevice = 5;
constexpr int kExitDiverged = 6;
constexpr int kExitInterrupted = 130;
}  // namespace ctx
