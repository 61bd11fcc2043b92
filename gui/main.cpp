// ctxplan-gui: the desktop explorer. A GLFW window with an OpenGL 3 context, Dear ImGui on top,
// the panels in panels.hpp over App. Headless use (CI, docs): --screenshot out.png renders
// --frames N frames (more while a search or curve is still computing), writes the PNG and a state
// report (out.report.json: selected plan, numbers shown, regions drawn, errors) and exits.
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "costmodel/exit_codes.hpp"
#include "gui/app.hpp"
#include "gui/panels.hpp"
#include "gui/screenshot.hpp"

namespace fs = std::filesystem;
using namespace ctx;
using namespace ctx::gui;

namespace {

struct Options {
  std::string profiles, settings, state, screenshot, report;
  bool no_settings = false;
  int frames = 3;
  std::string size;
  double timeout_seconds = 300;
};

// The settings file is read and written in interactive runs, and in headless runs only when
// --settings names it (so CI and tests never see a person's settings).
std::string settings_path(const Options& o) {
  if (o.no_settings) return "";
  if (!o.settings.empty()) return o.settings;
  if (!o.screenshot.empty()) return "";
  return (fs::path(config_dir()) / "gui.json").string();
}

// Window sizes from --size or the settings: kMinWindowPixels..kMaxWindowPixels a side (a huge size
// broke the X server connection).
bool parse_size(const std::string& s, int* w, int* h) {
  char tail = 0;
  return std::sscanf(s.c_str(), "%dx%d%c", w, h, &tail) == 2 && *w >= kMinWindowPixels && *h >= kMinWindowPixels &&
         *w <= kMaxWindowPixels && *h <= kMaxWindowPixels;
}

// Moves an unreadable settings file to <path>.unreadable (or .unreadable.N); returns the new name,
// "" when it could not be moved.
std::string set_aside(const std::string& path) {
  for (int i = 0; i < 100; ++i) {
    const std::string to = path + ".unreadable" + (i ? "." + std::to_string(i) : "");
    std::error_code ec;
    if (fs::exists(to, ec)) continue;
    fs::rename(path, to, ec);
    return ec ? "" : to;
  }
  return "";
}

// Ctrl-C or a TERM ends the loop like closing the window, so the settings are saved.
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

void glfw_error(int code, const char* what) { std::fprintf(stderr, "ctxplan-gui: GLFW error %d: %s\n", code, what); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"ctxplan-gui: explore parallel plans for long-context training (memory, time, search, timeline)"};
  Options o;
  cli.add_option("--profiles", o.profiles, "profiles folder (default: $CTXPLAN_PROFILES, else the source tree's)");
  cli.add_option("--settings", o.settings, "settings file (default $XDG_CONFIG_HOME/ctxplan/gui.json; headless: none)");
  cli.add_flag("--no-settings", o.no_settings, "neither read nor write a settings file");
  cli.add_option("--state", o.state, "a ctxplan.gui-state/1 JSON applied at start (inputs, plan, view, measured report)");
  cli.add_option("--screenshot", o.screenshot, "render headless, write this PNG and <name>.report.json, exit");
  cli.add_option("--report", o.report, "where the state report goes (default: next to the screenshot)");
  cli.add_option("--frames", o.frames, "frames to render before the screenshot (default 3; more while work is pending)")->check(CLI::Range(1, 100000));
  cli.add_option("--size", o.size, "window size WxH (default: the settings' or 1600x1000)");
  cli.add_option("--timeout", o.timeout_seconds, "headless: give up waiting for the search after this many seconds (default 300)");
  CLI11_PARSE(cli, argc, argv);
  const bool headless = !o.screenshot.empty();
  if (headless && o.report.empty()) o.report = fs::path(o.screenshot).replace_extension(".report.json").string();

  App app(o.profiles.empty() ? default_profiles_dir() : o.profiles);
  // the built-in default job, resolved first: what the app falls back to if later inputs are broken
  app.state.run_search = false;
  app.update(0);
  app.state.run_search = true;
  // settings, then the state file on top
  std::string settings = settings_path(o);
  if (!settings.empty() && fs::exists(settings)) {
    try {
      app.state = state_from_json(read_json_file(settings), settings, app.state);
      app.state.run_search = true, app.state.select_rank = -1, app.state.run_maxseq = false, app.state.export_plan.clear();
    } catch (const InputError& e) {
      // never write over a file that could not be read: it moves aside (kept for the user to fix),
      // and this session's settings are saved anew; if it cannot move, nothing is saved
      const std::string aside = set_aside(settings);
      const std::string what = std::string(e.what()) +
                               (aside.empty() ? "; the file is left as it is and this session's settings are not saved"
                                              : "; the file was moved to " + aside + " and the settings start anew");
      std::cerr << "ctxplan-gui: settings: " << what << "\n";
      app.set_error("settings", what);
      if (aside.empty()) settings.clear();
    }
  }
  if (!o.state.empty()) {
    try {
      app.state = state_from_json(read_json_file(o.state), o.state, app.state);
    } catch (const InputError& e) {
      std::cerr << "ctxplan-gui: " << e.what() << "\n";
      return kExitBadInput;
    }
  }
  int width = app.state.view.window_width, height = app.state.view.window_height;
  if (!o.size.empty() && !parse_size(o.size, &width, &height)) {
    std::cerr << "ctxplan-gui: --size: expected WxH with each side " << kMinWindowPixels << ".." << kMaxWindowPixels
              << " pixels, got '" << o.size << "'\n";
    return kExitBadInput;
  }
  app.inputs_changed(-1e9);  // apply now, no debounce
  app.plan_changed();
  if (!app.state.measured_path.empty()) app.load_measured(app.state.measured_path);

  glfwSetErrorCallback(glfw_error);
  if (!glfwInit()) {
    std::cerr << "ctxplan-gui: cannot initialise GLFW (no display? run under xvfb-run)\n";
    return kExitInternal;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 2);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GL_TRUE);
  GLFWwindow* window = glfwCreateWindow(width, height, "ctxplan-gui", nullptr, nullptr);
  if (!window) {
    std::cerr << "ctxplan-gui: cannot create an OpenGL 3.2 window\n";
    glfwTerminate();
    return kExitInternal;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(headless ? 0 : 1);
  // a file dropped on the window is a measured run (ctxrun report, stack log, memory_stats dump, CSV)
  glfwSetWindowUserPointer(window, &app);
  glfwSetDropCallback(window, [](GLFWwindow* w, int count, const char** paths) {
    std::vector<std::string> files(paths, paths + std::max(0, count));
    static_cast<App*>(glfwGetWindowUserPointer(w))->drop_files(files);
  });

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  // imgui's own window settings live next to ours, never in the working directory
  static std::string ini_path;
  if (!settings.empty()) {
    ini_path = (fs::path(settings).parent_path() / "imgui.ini").string();
    std::error_code ec;
    fs::create_directories(fs::path(ini_path).parent_path(), ec);
    io.IniFilename = ini_path.c_str();
  } else {
    io.IniFilename = nullptr;
  }
  ImGui::StyleColorsDark();
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 150");

  int frame = 0, idle_frames = 0;
  const double started = glfwGetTime();
  std::string last_saved = settings.empty() ? "" : state_to_json(app.state).dump();
  double last_save_check = 0;
  bool timed_out = false;
  int exit_code = kExitOk;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  while (!glfwWindowShouldClose(window) && !g_stop) {
    glfwPollEvents();
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    if (headless) io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);  // no hover effects wherever Xvfb's pointer sits
    ImGui::NewFrame();
    const double now = glfwGetTime();
    app.begin_frame();
    FrameRequests req;
    draw_main_window(app, now, frame < 3 || app.take_tab_request(), req);
    ImGui::Render();
    int fb_w = 0, fb_h = 0;
    glfwGetFramebufferSize(window, &fb_w, &fb_h);
    glViewport(0, 0, fb_w, fb_h);
    glClearColor(0.08f, 0.08f, 0.10f, 1);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    ++frame;

    if (!req.copy_text.empty()) ImGui::SetClipboardText(req.copy_text.c_str());
    if (!req.save_png.empty()) {
      try {
        save_framebuffer_png(req.save_png, fb_w, fb_h);
        app.status = "saved " + req.save_png;
      } catch (const InputError& e) {
        app.set_error("action", e);
      }
    }
    if (headless) {
      // the screenshot waits for the workers, then two more frames so their results are drawn
      idle_frames = app.idle() ? idle_frames + 1 : 0;
      timed_out = now - started > o.timeout_seconds;
      if ((frame >= o.frames && idle_frames >= 3) || timed_out) {
        if (!app.state.export_plan.empty()) {
          try {
            app.export_plan(app.state.export_plan);
            app.status = "wrote " + app.state.export_plan;
          } catch (const InputError& e) {
            app.set_error("action", e);
          }
        }
        try {
          save_framebuffer_png(o.screenshot, fb_w, fb_h);
          json report = app.report(frame);
          report["screenshot"] = o.screenshot;
          report["size"] = {fb_w, fb_h};
          report["timed_out"] = timed_out;
          write_file_atomic(o.report, report.dump(2) + "\n");
          std::cout << "ctxplan-gui: wrote " << o.screenshot << " and " << o.report << " after " << frame << " frames\n";
        } catch (const InputError& e) {
          std::cerr << "ctxplan-gui: " << e.what() << "\n";
          exit_code = kExitInternal;
        }
        if (timed_out) {
          // the workers may still be inside a simulation that does not poll for cancellation: the
          // process ends here rather than waiting for them to join (the report is written)
          std::cerr << "ctxplan-gui: timed out after " << o.timeout_seconds << " s waiting for the search\n";
          std::fflush(nullptr);
          std::_Exit(kExitInternal);
        }
        break;
      }
    }
    glfwSwapBuffers(window);

    // persist the settings a moment after they change
    if (!settings.empty() && now - last_save_check > 2) {
      last_save_check = now;
      glfwGetWindowSize(window, &app.state.view.window_width, &app.state.view.window_height);
      const std::string s = state_to_json(app.state).dump();
      if (s != last_saved) {
        try {
          save_state_file(settings, app.state);
          last_saved = s;
        } catch (const InputError& e) {
          app.set_error("settings", e);
          last_saved = s;  // do not retry every two seconds
        }
      }
    }
  }
  if (!settings.empty()) {
    glfwGetWindowSize(window, &app.state.view.window_width, &app.state.view.window_height);
    try {
      save_state_file(settings, app.state);
    } catch (const InputError& e) {
      std::cerr << "ctxplan-gui: " << e.what() << "\n";
    }
  }
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return exit_code;
}
