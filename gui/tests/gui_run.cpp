#include "gui_run.hpp"

#include <fcntl.h>
#include <stb/stb_image.h>  // prototypes; the implementation comes from libstb
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace ctx::gui::test {
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  for (std::string dir; std::getline(ss, dir, ':');)
    if (!dir.empty() && ::access((fs::path(dir) / program).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

std::string headless_unavailable() {
  if (on_path("xvfb-run")) return "";
  const char* display = std::getenv("DISPLAY");
  if (display && *display) return "";
  return "xvfb-run not found and no $DISPLAY: install xvfb and xauth (scripts/setup.sh) to run the GUI tests";
}

int64_t Image::count_color(const std::array<float, 4>& r, std::array<int, 3> c, int tol) const {
  int64_t n = 0;
  const int x0 = std::max(0, static_cast<int>(r[0])), y0 = std::max(0, static_cast<int>(r[1]));
  const int x1 = std::min(width, static_cast<int>(r[2])), y1 = std::min(height, static_cast<int>(r[3]));
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      const uint8_t* p = &rgb[(static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3];
      if (std::abs(p[0] - c[0]) <= tol && std::abs(p[1] - c[1]) <= tol && std::abs(p[2] - c[2]) <= tol) ++n;
    }
  return n;
}

int64_t Image::distinct_colors(const std::array<float, 4>& r) const {
  std::set<uint32_t> seen;
  const int x0 = std::max(0, static_cast<int>(r[0])), y0 = std::max(0, static_cast<int>(r[1]));
  const int x1 = std::min(width, static_cast<int>(r[2])), y1 = std::min(height, static_cast<int>(r[3]));
  for (int y = y0; y < y1 && seen.size() < 4096; ++y)
    for (int x = x0; x < x1; ++x) {
      const uint8_t* p = &rgb[(static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3];
      seen.insert(static_cast<uint32_t>(p[0]) << 16 | static_cast<uint32_t>(p[1]) << 8 | p[2]);
    }
  return static_cast<int64_t>(seen.size());
}

std::array<float, 4> GuiRun::region(const std::string& name) const {
  if (!report.is_object() || !report.contains("regions") || !report["regions"].contains(name)) return {0, 0, 0, 0};
  const json& r = report["regions"][name];
  return {r[0].get<float>(), r[1].get<float>(), r[2].get<float>(), r[3].get<float>()};
}

std::string fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("ctxplan-gui-test-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

int run_program(const std::vector<std::string>& args, std::string* out, const std::string& cwd) {
  const std::string out_path = (fs::temp_directory_path() / ("ctxplan-gui-test-out-" + std::to_string(::getpid()))).string();
  pid_t pid = fork();
  if (pid == 0) {
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) _exit(126);
    int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (out) *out = slurp(out_path);
  ::unlink(out_path.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

GuiRun run_gui(const std::string& dir, const std::string& name, const json& state, const std::vector<std::string>& extra) {
  GuiRun r;
  r.dir = dir;
  const std::string png = (fs::path(dir) / (name + ".png")).string();
  const std::string report = (fs::path(dir) / (name + ".report.json")).string();
  const std::string err = (fs::path(dir) / (name + ".stderr")).string();
  std::vector<std::string> argv;
  // -f: the X authority file lives in the test's folder. Without it xvfb-run makes a temporary
  // folder and exits 5 when removing it fails at the end ("problem while cleaning up temporary
  // directory", seen in CI once), which replaces the GUI's own exit code.
  if (on_path("xvfb-run"))
    argv = {"xvfb-run", "-a", "-f", (fs::path(dir) / (name + ".xauth")).string(), "-s", "-screen 0 1600x1000x24"};
  argv.insert(argv.end(), {CTXPLAN_GUI_BIN, "--screenshot", png, "--size", "1400x900", "--frames", "4"});
  if (std::find(extra.begin(), extra.end(), "--profiles") == extra.end())
    argv.insert(argv.end(), {"--profiles", std::string(CTXPLAN_SOURCE_DIR) + "/profiles"});
  if (!state.is_null()) {
    const std::string state_path = (fs::path(dir) / (name + ".state.json")).string();
    std::ofstream(state_path) << state.dump(2);
    argv.insert(argv.end(), {"--state", state_path});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  pid_t pid = fork();
  if (pid == 0) {
    if (::chdir(dir.c_str()) != 0) _exit(126);
    int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 2);
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = slurp(err);
  if (fs::exists(report)) r.report = json::parse(slurp(report), nullptr, false);
  int w = 0, h = 0, n = 0;
  if (uint8_t* px = stbi_load(png.c_str(), &w, &h, &n, 3)) {
    r.image.width = w;
    r.image.height = h;
    r.image.rgb.assign(px, px + static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
    stbi_image_free(px);
  }
  return r;
}

}  // namespace ctx::gui::test
