#include "sweeps/export.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/io/metrics.h"
#include "core/io/tensorboard.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/numbers.h"
#include "sweeps/run_dir.h"

namespace megabatch::sweeps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct SweepPoints {
  std::vector<std::pair<std::string, json>> points;  // id, configuration
  std::vector<std::string> axes;                      // keys whose values differ between points
};

SweepPoints read_points(const fs::path& dir) {
  const json s = read_sweep_state(dir);
  SweepPoints out;
  for (const auto& p : s["points"]) out.points.emplace_back(p["id"].get<std::string>(), p.value("config", json::object()));
  for (const auto& [id, config] : out.points)
    for (const auto& [k, v] : config.items()) {
      if (std::find(out.axes.begin(), out.axes.end(), k) != out.axes.end()) continue;
      for (const auto& [id2, other] : out.points)
        if (!other.contains(k) || other[k] != v) {
          out.axes.push_back(k);
          break;
        }
    }
  return out;
}

// A text cell of the CSV (RFC 4180: quoted when it holds a comma, a quote or a line break).
// Text that a spreadsheet program would run as a formula, starting with =, +, -, @, a tab
// or a carriage return, gets a leading apostrophe, which those programs show as text
// (OWASP's advice on CSV injection); text that is a plain number is left as it is.
std::string csv_field(const std::string& s) {
  std::string t = s;
  if (!t.empty() && std::string_view("=+-@\t\r").find(t[0]) != std::string_view::npos && !parse_finite(t)) t = "'" + t;
  if (t.find_first_of(",\"\n\r") == std::string::npos) return t;
  std::string q = "\"";
  for (const char c : t) {
    if (c == '"') q.push_back('"');
    q.push_back(c);
  }
  q.push_back('"');
  return q;
}

// A swept value's cell: numbers and booleans as they are, strings as text cells.
std::string value_cell(const json& v) {
  if (v.is_string()) return csv_field(v.get<std::string>());
  if (v.is_null()) return "";
  return csv_field(v.dump());  // a number, a boolean, or a list or object as JSON text
}

std::string number(double x) {
  if (!std::isfinite(x)) return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

using Series = std::map<std::string, std::vector<double>>;

// A point's series (the point in `point_dir`), none where it has written no metrics.h5 yet. A
// finished point's metrics.h5 that is missing or does not read is an error that says what to do.
std::optional<Series> point_series(const fs::path& point_dir) {
  const fs::path m = point_dir / "metrics.h5";
  std::string lost;
  if (fs::exists(m)) {
    try {
      return io::read_metric_series(m);
    } catch (const Error& e) {
      lost = e.what();
    }
  } else if (finished(point_dir)) {
    lost = m.string() + ": missing";
  } else {
    return std::nullopt;
  }
  // the command that runs the sweep's points runs it again: a launcher's, for an exported sweep
  fail(lost, "; this point's result is lost. ",
       exported(point_dir.parent_path())
           ? "Exporting (or submitting) the sweep's file again with --rerun damaged runs it again; "
           : "`sweep run` of the sweep's file with --rerun damaged runs it again; ",
       "or move the file away, and the export leaves the point out");
}

}  // namespace

int export_csv(const fs::path& dir, const fs::path& file) {
  const SweepPoints sp = read_points(dir);
  AtomicFile csv(file);  // a path it cannot write is refused before the metrics are read
  std::string out = "point";
  for (const auto& a : sp.axes) out += "," + csv_field(a);
  out += ",step,samples,metric,value\n";
  size_t rows = 0, skipped = 0;
  for (const auto& [id, config] : sp.points) {
    const auto read = point_series(dir / id);
    if (!read) {
      ++skipped;
      continue;
    }
    const Series& series = *read;
    std::string prefix = csv_field(id);
    for (const auto& a : sp.axes) prefix += "," + (config.contains(a) ? value_cell(config[a]) : std::string());
    const double batch = config.value("global_batch_size", 0.0);
    for (const auto& [name, values] : series) {  // steps: "<group>/iteration", group the first component
      const auto slash = name.find('/');
      if (slash == std::string::npos) continue;
      const std::string group = name.substr(0, slash);
      const auto steps = series.find(group + "/iteration");
      if (steps == series.end() || steps->first == name) continue;
      const auto samples = series.find(group + "/consumed_samples");
      for (size_t r = 0; r < values.size() && r < steps->second.size(); ++r) {
        const double step = steps->second[r];
        const double s = samples != series.end() && r < samples->second.size() ? samples->second[r] : step * batch;
        out += prefix + "," + number(step) + "," + number(s) + "," + csv_field(name) + "," + number(values[r]) + "\n";
        ++rows;
      }
    }
  }
  check(skipped < sp.points.size(), dir.string(), ": none of its ", sp.points.size(),
        " point(s) has metrics yet (no metrics.h5): nothing to export; run the sweep first");
  csv.write(out.data(), out.size());
  csv.commit();
  std::cout << file.string() << ": " << rows << " rows from " << sp.points.size() - skipped << " point(s)"
            << (skipped ? " (" + std::to_string(skipped) + " without metrics yet)" : std::string()) << std::endl;
  return 0;
}

int export_tensorboard(const fs::path& dir, const fs::path& out_dir) {
  const SweepPoints sp = read_points(dir);
  size_t written = 0;
  // every point's series read before the first event file is written: a lost result leaves none
  std::vector<std::pair<std::string, Series>> series;
  for (const auto& [id, config] : sp.points)
    if (auto read = point_series(dir / id)) series.emplace_back(id, std::move(*read));
  check(!series.empty(), dir.string(), ": none of its ", sp.points.size(),
        " point(s) has metrics yet (no metrics.h5): nothing to export; run the sweep first");
  for (const auto& [id, s] : series) {
    io::TensorBoardWriter tb(out_dir / id);
    tb.series(s);
    tb.flush();
    ++written;
  }
  std::cout << out_dir.string() << ": TensorBoard event files of " << written << " point(s); view with: tensorboard --logdir "
            << out_dir.string() << std::endl;
  return 0;
}

}  // namespace megabatch::sweeps
