// Drives an App without a window until nothing is left to compute (the simulated step, the search
// and the max-seq curve run on workers), failing the test if it does not settle in ~20 s.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gui/app.hpp"

namespace ctx::gui::test {

inline void settle(App& app, double now) {
  for (int i = 0; i < 20000; ++i) {
    app.update(now);
    if (app.idle()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  FAIL() << "the app did not settle";
}

}  // namespace ctx::gui::test
