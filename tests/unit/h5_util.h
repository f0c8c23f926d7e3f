// Minimal HDF5 read/write for tests that exchange tensors with the Python references.
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

#include "core/util/error.h"

namespace megabatch::testing {

class H5File {
 public:
  enum Mode { kRead, kCreate, kAppend };
  H5File(const std::string& path, Mode mode) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    id_ = mode == kCreate ? H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)
                          : H5Fopen(path.c_str(), mode == kAppend ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
    check(id_ >= 0, path, ": cannot open");
  }
  ~H5File() { H5Fclose(id_); }
  H5File(const H5File&) = delete;
  H5File& operator=(const H5File&) = delete;

  template <typename T>
  void write(const std::string& name, const std::vector<T>& data, std::vector<hsize_t> dims) {
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t d = H5Dcreate2(id_, name.c_str(), type<T>(), space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    check(d >= 0 && H5Dwrite(d, type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0, "write ", name);
    H5Dclose(d);
    H5Sclose(space);
    H5Pclose(lcpl);
  }
  template <typename T>
  std::vector<T> read(const std::string& name) {
    hid_t d = H5Dopen2(id_, name.c_str(), H5P_DEFAULT);
    check(d >= 0, "no dataset ", name);
    hid_t space = H5Dget_space(d);
    std::vector<T> out(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
    check(H5Dread(d, type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0, "read ", name);
    H5Sclose(space);
    H5Dclose(d);
    return out;
  }
  std::vector<hsize_t> dims(const std::string& name) {
    hid_t d = H5Dopen2(id_, name.c_str(), H5P_DEFAULT);
    check(d >= 0, "no dataset ", name);
    hid_t space = H5Dget_space(d);
    std::vector<hsize_t> out(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
    H5Sget_simple_extent_dims(space, out.data(), nullptr);
    H5Sclose(space);
    H5Dclose(d);
    return out;
  }
  // A 1-D dataset of variable-length strings.
  std::vector<std::string> read_strings(const std::string& name) {
    hid_t d = H5Dopen2(id_, name.c_str(), H5P_DEFAULT);
    check(d >= 0, "no dataset ", name);
    hid_t space = H5Dget_space(d);
    std::vector<char*> ptrs(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    check(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, ptrs.data()) >= 0, "read ", name);
    std::vector<std::string> out(ptrs.begin(), ptrs.end());
    H5Dvlen_reclaim(type, space, H5P_DEFAULT, ptrs.data());
    H5Tclose(type);
    H5Sclose(space);
    H5Dclose(d);
    return out;
  }
  void attr(const std::string& name, double v) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(id_, name.c_str(), H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    H5Sclose(space);
  }
  void attr(const std::string& name, const std::string& v) {  // variable-length string
    const char* text = v.c_str();
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(id_, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, type, &text);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }
  double attr(const std::string& name) {
    double v = 0;
    hid_t a = H5Aopen(id_, name.c_str(), H5P_DEFAULT);
    check(a >= 0 && H5Aread(a, H5T_NATIVE_DOUBLE, &v) >= 0, "no attribute ", name);
    H5Aclose(a);
    return v;
  }
  std::string attr_string(const std::string& name) {  // variable-length string attribute
    hid_t a = H5Aopen(id_, name.c_str(), H5P_DEFAULT);
    check(a >= 0, "no attribute ", name);
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);  // as core/io/h5.h writes them
    char* text = nullptr;
    const herr_t st = H5Aread(a, type, &text);
    std::string out = st >= 0 && text ? text : "";
    if (text) H5free_memory(text);
    H5Tclose(type);
    H5Aclose(a);
    check(st >= 0, "cannot read attribute ", name);
    return out;
  }
  bool has(const std::string& name) { return H5Lexists(id_, name.c_str(), H5P_DEFAULT) > 0; }

 private:
  template <typename T>
  static hid_t type() {
    if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
    else if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
    else return H5T_NATIVE_INT32;
  }
  hid_t id_;
};

}  // namespace megabatch::testing
