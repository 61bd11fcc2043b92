// Writes the current OpenGL framebuffer (the frame just rendered, before the swap) as a PNG.
#pragma once
#include <string>

namespace ctx::gui {

// Throws InputError naming the path when the file cannot be written.
void save_framebuffer_png(const std::string& path, int width, int height);

}  // namespace ctx::gui
