#include "sim/svg.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/text.h"

extern char** environ;

namespace apiary::sim {

Svg::Svg(double width, double height) : w_(width), h_(height) {}

void Svg::rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& extra) {
    body_ += fmt::format(
        "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" "
        "fill=\"{}\"{}{}/>\n",
        x, y, std::max(0.0, w), std::max(0.0, h), fill, extra.empty() ? "" : " ", extra);
}

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke,
               double width) {
    body_ += fmt::format(
        "<line x1=\"{:.2f}\" y1=\"{:.2f}\" x2=\"{:.2f}\" y2=\"{:.2f}\" stroke=\"{}\" "
        "stroke-width=\"{}\"/>\n",
        x1, y1, x2, y2, stroke, width);
}

void Svg::text(double x, double y, const std::string& s, double size, const std::string& anchor,
               const std::string& extra) {
    body_ += fmt::format(
        "<text x=\"{:.2f}\" y=\"{:.2f}\" font-size=\"{}\" text-anchor=\"{}\"{}{}>{}</text>\n", x, y,
        size, anchor, extra.empty() ? "" : " ", extra, xml_escape(s));
}

void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const std::string& stroke,
                   double width, const std::string& fill) {
    if (pts.empty()) return;
    std::string p;
    for (const auto& [x, y] : pts) p += fmt::format("{:.1f},{:.1f} ", x, y);
    body_ += fmt::format(
        "<polyline points=\"{}\" fill=\"{}\" stroke=\"{}\" stroke-width=\"{}\" "
        "stroke-linejoin=\"round\"/>\n",
        p, fill, stroke, width);
}

std::string Svg::str() const {
    return fmt::format(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" "
        "viewBox=\"0 0 {:.0f} {:.0f}\" font-family=\"DejaVu Sans, Helvetica, Arial, "
        "sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{}</svg>\n",
        w_, h_, w_, h_, body_);
}

std::string xml_escape(const std::string& s) { return core::xml_escape(s); }

std::vector<double> nice_ticks(double lo, double hi, int target) {
    std::vector<double> t;
    if (!(hi > lo)) return {lo};
    const double raw = (hi - lo) / std::max(1, target);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        if (m * mag >= raw) {
            step = m * mag;
            break;
        }
    }
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
        t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
    }
    return t;
}

std::string series_color(int i) {
    static const char* c[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                              "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    return c[size_t(i) % 8];
}

std::string job_color(int i) {
    const double hue = std::fmod(double(i) * 137.508, 360.0);  // golden angle
    return fmt::format("hsl({:.0f},55%,{}%)", hue, 55 + (i % 3) * 8);
}

std::pair<std::string, double> time_unit(double span_s) {
    if (span_s <= 2 * 60) return {"s", 1};
    if (span_s <= 3 * 3600) return {"min", 60};
    if (span_s <= 4 * 86400) return {"h", 3600};
    return {"days", 86400};
}

std::string short_number(double v) {
    const double a = std::abs(v);
    if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
    if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
    if (a >= 1e4) return fmt::format("{:.3g}k", v / 1e3);
    if (a >= 1e3) return fmt::format("{:.0f}", v);
    return fmt::format("{:.3g}", v);
}

std::string byte_size(double b) {
    const char* bin[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = b;
    int k = 0;
    while (k < 4 && v >= 1024 && std::fmod(v, 1024) == 0) v /= 1024, ++k;
    if (k > 0 || b < 1000) return fmt::format("{:g} {}", v, bin[k]);
    const char* dec[] = {"B", "kB", "MB", "GB", "TB"};
    v = b;
    k = 0;
    while (k < 4 && v >= 1000) v /= 1000, ++k;
    return fmt::format("{:.3g} {}", v, dec[k]);
}

void write_picture(const std::string& svg, const std::string& path) {
    namespace fs = std::filesystem;
    const std::string ext = fs::path(path).extension().string();
    if (ext != ".svg" && ext != ".png") {
        throw ConfigError(fmt::format("--svg {}: the picture must end in .svg or .png", path));
    }
    const std::string tmp_svg = path + ".tmp.svg";
    {
        std::ofstream out(tmp_svg, std::ios::binary);
        if (!out) throw IoError(fmt::format("--svg: cannot write '{}'", tmp_svg));
        out << svg;
        if (!out.flush()) throw IoError(fmt::format("--svg: writing '{}' failed", tmp_svg));
    }
    if (ext == ".svg") {
        fs::rename(tmp_svg, path);
        return;
    }
    const std::string tmp_png = path + ".tmp.png";
    // Spawned without a shell, so no file name is ever interpreted.
    std::string a0 = "rsvg-convert", a1 = "-o", a2 = tmp_png, a3 = tmp_svg;
    char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
    pid_t pid = 0;
    int rc = posix_spawnp(&pid, "rsvg-convert", nullptr, nullptr, argv, environ);
    if (rc == 0) {
        int status = 0;
        waitpid(pid, &status, 0);
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    } else {
        rc = 127;  // not found
    }
    fs::remove(tmp_svg);
    if (rc != 0) {
        fs::remove(tmp_png);
        throw IoError(fmt::format(
            "--svg {}: rsvg-convert failed (exit {}); PNG needs it (Debian: librsvg2-bin), or "
            "write an .svg",
            path, rc));
    }
    fs::rename(tmp_png, path);
}

}  // namespace apiary::sim
