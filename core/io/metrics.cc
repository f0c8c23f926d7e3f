#include "core/io/metrics.h"

#include <hdf5.h>

#include <algorithm>
#include <cstring>

#include "core/io/h5.h"
#include "core/util/error.h"

namespace megabatch::io {
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

// Creates (replacing) the file with the configuration attributes.
void create_file(const std::filesystem::path& path, const nlohmann::json& config) {
  silence_hdf5();
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  Handle f(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  check(f.id >= 0, path.string(), ": cannot create the metrics file (check the directory exists and is writable)");
  write_config(f.id, config, path.string());
  check(H5Fflush(f.id, H5F_SCOPE_GLOBAL) >= 0, path.string(), ": cannot flush");
}

}  // namespace

MetricsFile::MetricsFile(std::filesystem::path path, const nlohmann::json& config) : path_(std::move(path)) {
  create_file(path_, config);
}

MetricsFile::MetricsFile(std::filesystem::path path, const nlohmann::json& config, int64_t resume_after)
    : path_(std::move(path)) {
  silence_hdf5();
  if (!std::filesystem::exists(path_)) {
    create_file(path_, config);
    return;
  }
  Handle f(H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  check(f.id >= 0, path_.string(), ": cannot open the metrics file to continue it (is it an HDF5 file?)");
  for (const auto& [k, v] : config.items())
    if (H5Aexists(f.id, k.c_str()) > 0) H5Adelete(f.id, k.c_str());
  if (H5Aexists(f.id, "config") > 0) H5Adelete(f.id, "config");
  write_config(f.id, config, path_.string());
  H5G_info_t info{};
  H5Gget_info(f.id, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    char name[256];
    H5Lget_name_by_idx(f.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
    H5O_info_t oi{};
    if (H5Oget_info_by_name2(f.id, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) >= 0 && oi.type == H5O_TYPE_GROUP)
      truncate_group(f.id, name, resume_after, path_.string());
  }
  // String datasets already there stay as they are (a resumed run has the same model:
  // the checkpoint loader refuses any other).
  if (H5Lexists(f.id, "optimizer/tensor_names", H5P_DEFAULT) > 0) kept_strings_.insert("optimizer/tensor_names");
  check(H5Fflush(f.id, H5F_SCOPE_GLOBAL) >= 0, path_.string(), ": cannot flush");
}

MetricsFile::~MetricsFile() {
  try {
    flush();
  } catch (const std::exception&) {
  }
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

void MetricsFile::flush() {
  bool any = !strings_.empty();
  for (const auto& [series, p] : pending_) any = any || !p.values.empty();
  if (!any) return;
  Handle f(H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
  check(f.id >= 0, path_.string(), ": cannot reopen the metrics file to append (was it removed or moved?)");
  for (auto& [name, values] : strings_) {
    if (H5Lexists(f.id, name.c_str(), H5P_DEFAULT) <= 0) {
      std::vector<const char*> ptrs;
      for (const auto& v : values) ptrs.push_back(v.c_str());
      Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(type.id, H5T_VARIABLE);
      H5Tset_cset(type.id, H5T_CSET_UTF8);
      const hsize_t n = values.size();
      Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
      Handle lcpl(create_link_props(), H5Pclose);
      Handle d(H5Dcreate2(f.id, name.c_str(), type.id, space.id, lcpl.id, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
      check(d.id >= 0 && H5Dwrite(d.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) >= 0, path_.string(),
            ": cannot write ", name, " (disk full?)");
    }
    written_strings_[name] = values;
  }
  strings_.clear();
  for (auto& [series, p] : pending_) {
    if (p.values.empty()) continue;
    const int rank = p.width == 0 ? 1 : 2;
    const hsize_t width = p.width == 0 ? 1 : p.width;
    const hsize_t rows = p.values.size() / width;
    hid_t d = -1;
    if (H5Lexists(f.id, series.c_str(), H5P_DEFAULT) > 0) {
      d = H5Dopen2(f.id, series.c_str(), H5P_DEFAULT);
    } else {
      Handle lcpl(create_link_props(), H5Pclose);
      const hsize_t zero[2] = {0, width}, max[2] = {H5S_UNLIMITED, width};
      const hsize_t chunk[2] = {rank == 1 ? hsize_t{1024} : std::max<hsize_t>(1, 8192 / width), width};
      Handle space(H5Screate_simple(rank, zero, max), H5Sclose);
      Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_chunk(dcpl.id, rank, chunk);
      d = H5Dcreate2(f.id, series.c_str(), H5T_NATIVE_DOUBLE, space.id, lcpl.id, dcpl.id, H5P_DEFAULT);
    }
    Handle ds(d, H5Dclose);
    check(ds.id >= 0, path_.string(), ": cannot open or create series ", series);
    Handle old_space(H5Dget_space(ds.id), H5Sclose);
    check(H5Sget_simple_extent_ndims(old_space.id) == rank, path_.string(), ": series ", series,
          " exists with a different number of dimensions");
    hsize_t old[2] = {0, 0};
    H5Sget_simple_extent_dims(old_space.id, old, nullptr);
    check(rank == 1 || old[1] == width, path_.string(), ": series ", series, " has ", old[1],
          " columns; got rows of ", width);
    const hsize_t total[2] = {old[0] + rows, width};
    check(H5Dset_extent(ds.id, total) >= 0, path_.string(), ": cannot extend series ", series);
    Handle space(H5Dget_space(ds.id), H5Sclose);
    const hsize_t start[2] = {old[0], 0}, count[2] = {rows, width};
    H5Sselect_hyperslab(space.id, H5S_SELECT_SET, start, nullptr, count, nullptr);
    Handle mem(H5Screate_simple(rank, count, nullptr), H5Sclose);
    check(H5Dwrite(ds.id, H5T_NATIVE_DOUBLE, mem.id, space.id, H5P_DEFAULT, p.values.data()) >= 0, path_.string(),
          ": cannot write series ", series, " (disk full?)");
    p.values.clear();
  }
  check(H5Fflush(f.id, H5F_SCOPE_GLOBAL) >= 0, path_.string(), ": cannot flush (disk full?)");
}

}  // namespace megabatch::io
