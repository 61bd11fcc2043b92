#include "gui/screenshot.hpp"

#include <GL/gl.h>
#include <stb/stb_image_write.h>  // prototypes; the implementation comes from libstb

#include <cstdint>
#include <vector>

#include "costmodel/errors.hpp"

namespace ctx::gui {

void save_framebuffer_png(const std::string& path, int width, int height) {
  if (width <= 0 || height <= 0) throw InputError(path, "", "nothing to capture: the framebuffer is empty");
  std::vector<uint8_t> pixels(static_cast<size_t>(width) * static_cast<size_t>(height) * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadBuffer(GL_BACK);
  glReadPixels(0, 0, width, height, GL_RGBA, GL_UNSIGNED_BYTE, pixels.data());
  // OpenGL's first row is the bottom one; PNG's is the top. Opaque alpha: the window has no
  // transparency, whatever the blend left in the alpha channel.
  std::vector<uint8_t> flipped(pixels.size());
  const size_t stride = static_cast<size_t>(width) * 4;
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = pixels.data() + static_cast<size_t>(height - 1 - y) * stride;
    uint8_t* dst = flipped.data() + static_cast<size_t>(y) * stride;
    for (size_t i = 0; i < stride; i += 4) dst[i] = src[i], dst[i + 1] = src[i + 1], dst[i + 2] = src[i + 2], dst[i + 3] = 255;
  }
  if (!stbi_write_png(path.c_str(), width, height, 4, flipped.data(), static_cast<int>(stride)))
    throw InputError(path, "", "cannot write the PNG");
}

}  // namespace ctx::gui
