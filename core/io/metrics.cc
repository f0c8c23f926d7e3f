#include "core/io/metrics.h"

#include <hdf5.h>

#include <algorithm>
#include <cstring>

#include "core/util/error.h"

namespace megabatch::io {
namespace {

struct Handle {  // closes an HDF5 id with the matching function
  hid_t id;
  herr_t (*close)(hid_t);
  Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Handle() {
    if (id >= 0) close(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

void silence_hdf5() {
  static bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

void write_attr(hid_t loc, const std::string& name, const nlohmann::json& v, const std::string& file) {
  if (v.is_number_integer() || v.is_boolean()) {
    const int64_t x = v.is_boolean() ? (v.get<bool>() ? 1 : 0) : v.get<int64_t>();
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    Handle a(H5Acreate2(loc, name.c_str(), H5T_NATIVE_INT64, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    check(a.id >= 0 && H5Awrite(a.id, H5T_NATIVE_INT64, &x) >= 0, file, ": cannot write attribute ", name);
  } else if (v.is_number()) {
    const double x = v.get<double>();
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    Handle a(H5Acreate2(loc, name.c_str(), H5T_NATIVE_DOUBLE, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    check(a.id >= 0 && H5Awrite(a.id, H5T_NATIVE_DOUBLE, &x) >= 0, file, ": cannot write attribute ", name);
  } else {
    // variable-length UTF-8, which h5py reads back as str
    const std::string s = v.is_string() ? v.get<std::string>() : v.dump();
    const char* text = s.c_str();
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.id, H5T_VARIABLE);
    H5Tset_cset(type.id, H5T_CSET_UTF8);
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    Handle a(H5Acreate2(loc, name.c_str(), type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    check(a.id >= 0 && H5Awrite(a.id, type.id, &text) >= 0, file, ": cannot write attribute ", name);
  }
}

}  // namespace

MetricsFile::MetricsFile(std::filesystem::path path, const nlohmann::json& config) : path_(std::move(path)) {
  silence_hdf5();
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
  Handle f(H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  check(f.id >= 0, path_.string(), ": cannot create the metrics file (check the directory exists and is writable)");
  write_attr(f.id, "config", config.dump(), path_.string());
  for (const auto& [k, v] : config.items())  // each scalar option also as its own attribute
    if (k != "config" && v.is_primitive() && !v.is_null()) write_attr(f.id, k, v, path_.string());
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
