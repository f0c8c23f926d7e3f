#include "core/io/metrics.h"

#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <type_traits>

#include "core/io/h5.h"
#include "core/util/error.h"
#include "core/util/files.h"

namespace megabatch::io {
static_assert(std::is_same_v<hid_t, int64_t>, "metrics.h keeps the file id as int64_t");
namespace {

void write_config(hid_t f, const nlohmann::json& config, const std::string& path) {
  write_attr(f, "config", config.dump(), path);
  for (const auto& [k, v] : config.items())  // each scalar option also as its own attribute
    if (k != "config" && v.is_primitive() && !v.is_null()) write_attr(f, k, v, path);
}

// Rows of group `group` to keep: those up to the first whose iteration exceeds `last`.
void truncate_group(hid_t f, const std::string& group, int64_t last, const std::string& path) {
  const std::string iter_name = group + "/iteration";
  if (H5Lexists(f, iter_name.c_str(), H5P_DEFAULT) <= 0) return;
  std::vector<double> iters;
  {
    Handle d(H5Dopen2(f, iter_name.c_str(), H5P_DEFAULT), H5Dclose);
    Handle space(H5Dget_space(d.id), H5Sclose);
    iters.resize(static_cast<size_t>(H5Sget_simple_extent_npoints(space.id)));
    if (!iters.empty())
      check(H5Dread(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, iters.data()) >= 0, path, ": cannot read ",
            iter_name);
  }
  hsize_t keep = 0;
  while (keep < iters.size() && iters[keep] <= static_cast<double>(last)) ++keep;
  Handle g(H5Gopen2(f, group.c_str(), H5P_DEFAULT), H5Gclose);
  H5G_info_t info{};
  H5Gget_info(g.id, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256];
    H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
    Handle d(H5Dopen2(g.id, name, H5P_DEFAULT), H5Dclose);
    if (d.id < 0) continue;
    Handle space(H5Dget_space(d.id), H5Sclose);
    hsize_t dims[2] = {0, 0}, max[2] = {0, 0};
    const int rank = H5Sget_simple_extent_dims(space.id, dims, max);
    if (rank < 1 || max[0] != H5S_UNLIMITED || dims[0] <= keep) continue;  // not a series, or nothing to drop
    dims[0] = keep;
    check(H5Dset_extent(d.id, dims) >= 0, path, ": cannot truncate ", group, "/", name);
  }
}

// A 1-D string dataset (variable or fixed length, as train or h5py writes it) as strings;
// empty when `name` is no such dataset.
std::vector<std::string> read_strings(hid_t f, const std::string& name) {
  if (H5Lexists(f, name.c_str(), H5P_DEFAULT) <= 0) return {};
  Handle d(H5Dopen2(f, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (d.id < 0) return {};
  Handle type(H5Dget_type(d.id), H5Tclose);
  Handle space(H5Dget_space(d.id), H5Sclose);
  if (H5Tget_class(type.id) != H5T_STRING || H5Sget_simple_extent_ndims(space.id) != 1) return {};
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.id, &n, nullptr);
  std::vector<std::string> out;
  Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_cset(mem.id, H5Tget_cset(type.id));  // HDF5 converts no strings between ASCII and UTF-8
  if (H5Tis_variable_str(type.id) > 0) {
    H5Tset_size(mem.id, H5T_VARIABLE);
    std::vector<char*> ptrs(n, nullptr);
    if (n && H5Dread(d.id, mem.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) < 0) return {};
    for (char* p : ptrs) {
      out.emplace_back(p ? p : "");
      if (p) H5free_memory(p);
    }
  } else {
    const size_t width = H5Tget_size(type.id);
    H5Tset_size(mem.id, width);
    H5Tset_strpad(mem.id, H5T_STR_NULLPAD);
    std::vector<char> buf(n * width);
    if (n && H5Dread(d.id, mem.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) return {};
    for (size_t i = 0; i < n; ++i) out.emplace_back(buf.data() + i * width, strnlen(buf.data() + i * width, width));
  }
  return out;
}

// The rows of 2-D series "group/name" (row-major, `width` values a row) as a series per
// column in `out`, "group/name/<column>": the column named by "group/tensor_names" where it
// has `width` names, else by its index.
void add_columns(hid_t f, const std::string& series, size_t width, const std::vector<double>& values,
                 std::map<std::string, std::vector<double>>& out) {
  const auto slash = series.find('/');
  std::vector<std::string> names;
  if (slash != std::string::npos) names = read_strings(f, series.substr(0, slash) + "/tensor_names");
  for (size_t c = 0; c < width; ++c) {
    std::vector<double>& column = out[series + "/" + (names.size() == width ? names[c] : std::to_string(c))];
    for (size_t r = c; r < values.size(); r += width) column.push_back(values[r]);
  }
}

// File access through HDF5's core driver without a backing store: the file lives in
// memory, and persist() writes its image to disk.
hid_t in_memory_access() {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_core(fapl, size_t{1} << 20, 0);
  return fapl;
}

// The in-memory file's name: HDF5 needs one, and the core driver refuses to open an image
// under a name that exists on disk; this one names the file and never exists.
std::string memory_name(const std::filesystem::path& path) {
  return "/nonexistent/megabatch-in-memory" + std::filesystem::absolute(path).string();
}

// An in-memory file holding the configuration attributes.
hid_t create_in_memory(const std::filesystem::path& path, const nlohmann::json& config) {
  silence_hdf5();
  Handle fapl(in_memory_access(), H5Pclose);
  const hid_t f = H5Fcreate(memory_name(path).c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id);
  check(f >= 0, path.string(), ": cannot create the metrics file in memory");
  write_config(f, config, path.string());
  return f;
}

}  // namespace

namespace {
// A temporary file left by a write that was killed or failed: never the metrics.
void remove_stale_temporary(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove(std::filesystem::path(path.string() + ".tmp"), ec);
}
}  // namespace

MetricsFile::MetricsFile(std::filesystem::path path, const nlohmann::json& config) : path_(std::move(path)) {
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
  remove_stale_temporary(path_);
  file_ = create_in_memory(path_, config);
  persist();
}

MetricsFile::MetricsFile(std::filesystem::path path, const nlohmann::json& config, int64_t resume_after)
    : path_(std::move(path)) {
  silence_hdf5();
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
  remove_stale_temporary(path_);
  if (!std::filesystem::exists(path_)) {
    file_ = create_in_memory(path_, config);
    persist();
    return;
  }
  // The file's bytes, read here, become the in-memory file's image: HDF5 never opens (or
  // locks) the file on disk, so readers are never locked out.
  std::vector<char> bytes;
  {
    std::ifstream in(path_, std::ios::binary);
    check(in.good(), path_.string(), ": cannot read the metrics file to continue it");
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  Handle fapl(in_memory_access(), H5Pclose);
  if (!bytes.empty()) H5Pset_file_image(fapl.id, bytes.data(), bytes.size());
  file_ = H5Fopen(memory_name(path_).c_str(), H5F_ACC_RDWR, fapl.id);
  if (file_ < 0) {
    const std::string cut = h5_truncation();
    fail(path_.string(), ": cannot open the metrics file to continue it (", cut.empty() ? "not an HDF5 file?" : cut,
         "); move it away to start a new one");
  }
  const hid_t f = file_;
  for (const auto& [k, v] : config.items())
    if (H5Aexists(f, k.c_str()) > 0) H5Adelete(f, k.c_str());
  if (H5Aexists(f, "config") > 0) H5Adelete(f, "config");
  write_config(f, config, path_.string());
  H5G_info_t info{};
  H5Gget_info(f, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256];
    H5Lget_name_by_idx(f, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
    H5O_info_t oi{};
    if (H5Oget_info_by_name2(f, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 && oi.type == H5O_TYPE_GROUP)
      truncate_group(f, name, resume_after, path_.string());
  }
  // String datasets already there stay as they are (a resumed run has the same model:
  // the checkpoint loader refuses any other).
  if (H5Lexists(f, "optimizer/tensor_names", H5P_DEFAULT) > 0) kept_strings_.insert("optimizer/tensor_names");
  persist();
}

MetricsFile::~MetricsFile() {
  try {
    flush();
  } catch (const std::exception&) {
  }
  if (file_ >= 0) H5Fclose(file_);
}

void MetricsFile::persist() {
  check(H5Fflush(file_, H5F_SCOPE_GLOBAL) >= 0, path_.string(), ": cannot flush the in-memory file");
  const ssize_t size = H5Fget_file_image(file_, nullptr, 0);
  check(size > 0, path_.string(), ": cannot take the file's image");
  image_.resize(static_cast<size_t>(size));
  check(H5Fget_file_image(file_, image_.data(), image_.size()) == size, path_.string(), ": cannot take the file's image");
  AtomicFile out(path_);  // PATH.tmp, fsync'ed, renamed over PATH: PATH is always a whole file
  out.write(image_.data(), image_.size());
  out.commit();
}

void MetricsFile::append(const std::string& series, double value) {
  Pending& p = pending_[series];
  check(p.width == 0, path_.string(), ": series ", series, " holds rows of ", p.width, " values, not scalars");
  p.values.push_back(value);
}

void MetricsFile::append_row(const std::string& series, const std::vector<double>& row) {
  check(!row.empty(), path_.string(), ": empty row for series ", series);
  Pending& p = pending_[series];
  if (p.width == 0 && p.values.empty()) p.width = row.size();
  check(p.width == row.size(), path_.string(), ": series ", series, " holds rows of ", p.width,
        " values; got a row of ", row.size());
  p.values.insert(p.values.end(), row.begin(), row.end());
}

void MetricsFile::set_strings(const std::string& name, const std::vector<std::string>& values) {
  if (kept_strings_.count(name)) return;
  auto done = written_strings_.find(name);
  if (done != written_strings_.end()) {
    check(done->second == values, path_.string(), ": ", name, " was already written with different values");
    return;
  }
  strings_[name] = values;
}

namespace {
hid_t create_link_props() {
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  return lcpl;
}
}  // namespace

namespace {
// Writes a list of strings as a dataset of UTF-8 strings, once (an existing one is kept).
void write_strings(hid_t file, const std::filesystem::path& path, const std::string& name,
                   const std::vector<std::string>& values) {
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) > 0) return;
  std::vector<const char*> ptrs;
  for (const auto& v : values) ptrs.push_back(v.c_str());
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.id, H5T_VARIABLE);
  H5Tset_cset(type.id, H5T_CSET_UTF8);
  const hsize_t n = values.size();
  Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Handle lcpl(create_link_props(), H5Pclose);
  Handle d(H5Dcreate2(file, name.c_str(), type.id, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  check(d.id >= 0 && H5Dwrite(d.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) >= 0, path.string(),
        ": cannot write ", name);
}

// Appends rows (of `width` values; 0: a 1-D series) to an extendible series of doubles,
// made chunked where it does not exist yet.
void append_series(hid_t file, const std::filesystem::path& path, const std::string& series, size_t width0,
                   const std::vector<double>& values) {
  const int rank = width0 == 0 ? 1 : 2;
  const hsize_t width = width0 == 0 ? 1 : width0;
  const hsize_t rows = values.size() / width;
  hid_t d = -1;
  if (H5Lexists(file, series.c_str(), H5P_DEFAULT) > 0) {
    d = H5Dopen2(file, series.c_str(), H5P_DEFAULT);
  } else {
    Handle lcpl(create_link_props(), H5Pclose);
    const hsize_t zero[2] = {0, width}, max[2] = {H5S_UNLIMITED, width};
    const hsize_t chunk[2] = {rank == 1 ? hsize_t{1024} : std::max<hsize_t>(1, 8192 / width), width};
    Handle space(H5Screate_simple(rank, zero, max), H5Sclose);
    Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_chunk(dcpl.id, rank, chunk);
    d = H5Dcreate2(file, series.c_str(), H5T_NATIVE_DOUBLE, space.id, lcpl.id, dcpl.id, H5P_DEFAULT);
  }
  Handle ds(d, H5Dclose);
  check(ds.id >= 0, path.string(), ": cannot open or create series ", series);
  Handle old_space(H5Dget_space(ds.id), H5Sclose);
  check(H5Sget_simple_extent_ndims(old_space.id) == rank, path.string(), ": series ", series,
        " exists with a different number of dimensions");
  hsize_t old[2] = {0, 0};
  H5Sget_simple_extent_dims(old_space.id, old, nullptr);
  check(rank == 1 || old[1] == width, path.string(), ": series ", series, " has ", old[1], " columns; got rows of ", width);
  const hsize_t total[2] = {old[0] + rows, width};
  check(H5Dset_extent(ds.id, total) >= 0, path.string(), ": cannot extend series ", series);
  Handle space(H5Dget_space(ds.id), H5Sclose);
  const hsize_t start[2] = {old[0], 0}, count[2] = {rows, width};
  H5Sselect_hyperslab(space.id, H5S_SELECT_SET, start, nullptr, count, nullptr);
  Handle mem(H5Screate_simple(rank, count, nullptr), H5Sclose);
  check(H5Dwrite(ds.id, H5T_NATIVE_DOUBLE, mem.id, space.id, H5P_DEFAULT, values.data()) >= 0, path.string(),
        ": cannot write series ", series);
}
}  // namespace

void MetricsFile::flush() {
  bool any = !strings_.empty();
  for (const auto& [series, p] : pending_) any = any || !p.values.empty();
  if (!any) return;
  for (auto& [name, values] : strings_) {
    write_strings(file_, path_, name, values);
    written_strings_[name] = values;
  }
  strings_.clear();
  if (listener_) {  // the new rows of every series, before they are written; a 2-D one's columns by name
    std::map<std::string, std::vector<double>> rows;
    for (const auto& [series, p] : pending_) {
      if (p.values.empty()) continue;
      if (p.width == 0) rows[series] = p.values;
      else add_columns(file_, series, p.width, p.values, rows);
    }
    if (!rows.empty()) listener_(rows);
  }
  for (auto& [series, p] : pending_) {
    if (p.values.empty()) continue;
    append_series(file_, path_, series, p.width, p.values);
    p.values.clear();
  }
  persist();
}

}  // namespace megabatch::io

namespace megabatch::io {

namespace {

// A metrics.h5 opened for reading; an error naming it where it does not open.
hid_t open_metrics(const std::filesystem::path& path) {
  silence_hdf5();
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) {
    const std::string cut = h5_truncation();
    fail(path.string(), ": ", cut.empty() ? "cannot open as HDF5 (not a metrics.h5 written by train?)" : cut);
  }
  return f;
}

// Calls read(name, dataset, rank, dims) for each numeric series of `f` (a 1-D or 2-D dataset
// of numbers; dims[1] is 1 for a 1-D one); an error naming the file and the series where an object does not
// open, or read returns false (its values do not read).
using SeriesReader = std::function<bool(const char* name, hid_t dataset, int rank, const hsize_t* dims)>;
void for_each_series(hid_t f, const std::filesystem::path& path, const SeriesReader& read) {
  struct Visit {
    const SeriesReader& read;
    std::string unread;  // the object that does not read
  } visit{read, {}};
  const herr_t visited = H5Lvisit(
      f, H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t root, const char* name, const H5L_info_t*, void* data) -> herr_t {
        Visit& v = *static_cast<Visit*>(data);
        v.unread = name;
        H5O_info_t info;
        if (H5Oget_info_by_name2(root, name, &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) return -1;
        if (info.type != H5O_TYPE_DATASET) return 0;
        Handle d(H5Dopen2(root, name, H5P_DEFAULT), H5Dclose);
        if (d.id < 0) return -1;
        Handle type(H5Dget_type(d.id), H5Tclose);
        const H5T_class_t c = H5Tget_class(type.id);
        if (c != H5T_FLOAT && c != H5T_INTEGER) return 0;
        Handle space(H5Dget_space(d.id), H5Sclose);
        const int rank = H5Sget_simple_extent_ndims(space.id);
        if (rank != 1 && rank != 2) return 0;
        hsize_t dims[2] = {0, 1};
        H5Sget_simple_extent_dims(space.id, dims, nullptr);
        if (dims[1] == 0) return 0;
        return v.read(name, d.id, rank, dims) ? 0 : -1;
      },
      &visit);
  check(visited >= 0, path.string(), ": ", visit.unread.empty() ? "its groups" : "series " + visit.unread,
        " cannot be read (a damaged or cut-short copy?)");
}

}  // namespace

std::map<std::string, std::vector<double>> read_metric_series(const std::filesystem::path& path) {
  Handle f(open_metrics(path), H5Fclose);
  std::map<std::string, std::vector<double>> series;
  std::map<std::string, std::pair<size_t, std::vector<double>>> tables;  // 2-D: width, row-major values
  for_each_series(f.id, path, [&](const char* name, hid_t d, int rank, const hsize_t* dims) {
    std::vector<double> v(dims[0] * dims[1]);
    if (!v.empty() && H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) return false;
    if (rank == 1)
      series[name] = std::move(v);
    else
      tables[name] = {static_cast<size_t>(dims[1]), std::move(v)};
    return true;
  });
  for (const auto& [name, table] : tables) add_columns(f.id, name, table.first, table.second, series);
  return series;
}

std::string metrics_unreadable(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return path.string() + ": missing";
  try {
    // each series' last value read: its chunk index walked from the root to the last chunk,
    // without reading the whole file (a long run's diagnostics are megabytes)
    Handle f(open_metrics(path), H5Fclose);
    for_each_series(f.id, path, [](const char*, hid_t d, int, const hsize_t* dims) {
      if (dims[0] == 0) return true;
      Handle space(H5Dget_space(d), H5Sclose);
      const hsize_t at[2] = {dims[0] - 1, dims[1] - 1}, one[2] = {1, 1};
      Handle mem(H5Screate_simple(1, one, nullptr), H5Sclose);
      double last = 0;
      return H5Sselect_hyperslab(space.id, H5S_SELECT_SET, at, nullptr, one, nullptr) >= 0 &&
             H5Dread(d, H5T_NATIVE_DOUBLE, mem.id, space.id, H5P_DEFAULT, &last) >= 0;
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace megabatch::io
