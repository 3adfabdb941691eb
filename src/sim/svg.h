#pragma once
// A small SVG writer for the simulator's pictures (no plotting library in
// Debian's C++ world fits): rectangles, lines, text, polylines, nice axis
// ticks, and a writer that produces .svg directly or .png through
// rsvg-convert (Debian's librsvg2-bin).

#include <string>
#include <utility>
#include <vector>

namespace apiary::sim {

class Svg {
  public:
    Svg(double width, double height);
    void rect(double x, double y, double w, double h, const std::string& fill,
              const std::string& extra = "");
    void line(double x1, double y1, double x2, double y2, const std::string& stroke,
              double width = 1);
    void text(double x, double y, const std::string& s, double size = 12,
              const std::string& anchor = "start", const std::string& extra = "");
    void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke,
                  double width = 1.5, const std::string& fill = "none");
    void raw(const std::string& s) { body_ += s; }
    std::string str() const;
    double width() const { return w_; }
    double height() const { return h_; }

  private:
    double w_, h_;
    std::string body_;
};

std::string xml_escape(const std::string& s);
// Ticks at 1, 2 or 5 x 10^k covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);
// A distinct colour for the i-th series (policies, placements).
std::string series_color(int i);
// A colour for job i (spread hues, so neighbours differ).
std::string job_color(int i);
// A time span as a unit for an axis: ("h", 3600) for hours, etc.
std::pair<std::string, double> time_unit(double span_s);
// A number with 3-4 significant digits and a k/M/G suffix.
std::string short_number(double v);
// Bytes in binary units when exact ("64 MiB"), decimal otherwise ("256 MB").
std::string byte_size(double bytes);

// Writes `svg` to `path`: .svg as is, .png through rsvg-convert. The file
// appears whole or not at all (written to a temporary name, then renamed).
void write_picture(const std::string& svg, const std::string& path);

}  // namespace apiary::sim
