// Small RAII and attribute helpers over the HDF5 C API, shared by metrics.h5 and the
// checkpoints (internal to core/io).
#pragma once

#include <hdf5.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/util/error.h"

namespace megabatch::io {

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

// Before the first HDF5 call: no error printing (our errors name the file), and no
// library clean-up at exit. HDF5's exit handler closes files still open, and one whose
// write failed (a full disk) stays open in the library and crashes that handler; every
// file here is closed explicitly, so there is nothing left for it to do.
inline void silence_hdf5() {
  static bool done = [] {
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

// The operating system's reason for the HDF5 call that just failed, as " (No space left
// on device)", from HDF5's error stack ("..., error message = '...'"), or " (disk full?)"
// when the stack holds none. Call right after the failing call.
inline std::string h5_os_reason() {
  std::string found;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        auto& f = *static_cast<std::string*>(out);
        if (!f.empty() || e->desc == nullptr) return 0;
        const std::string d = e->desc, key = "error message = '";
        const size_t a = d.find(key);
        if (a != std::string::npos) {
          const size_t b = d.find('\'', a + key.size());
          if (b != std::string::npos) f = d.substr(a + key.size(), b - a - key.size());
        }
        return 0;
      },
      &found);
  return found.empty() ? " (disk full?)" : " (" + found + ")";
}

// Right after an H5Fopen that failed: "cut short: N of its M bytes are there" where HDF5
// found the file shorter than its superblock says it is (a copy that stopped, a disk that
// filled), else "".
inline std::string h5_truncation() {
  std::string found;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        // HDF5's words: "truncated file: eof = 3000, sblock->base_addr = 0, stored_eof = 208208"
        unsigned long long eof = 0, base = 0, stored = 0;
        if (e->desc != nullptr &&
            std::sscanf(e->desc, "truncated file: eof = %llu, sblock->base_addr = %llu, stored_eof = %llu", &eof, &base,
                        &stored) == 3)
          *static_cast<std::string*>(out) =
              "cut short: " + std::to_string(eof) + " of its " + std::to_string(stored) + " bytes are there";
        return 0;
      },
      &found);
  return found;
}

inline void write_attr(hid_t loc, const std::string& name, const nlohmann::json& v, const std::string& file) {
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


// Reads a scalar attribute written by write_attr: numbers as JSON numbers, strings as
// strings. Error naming `file` when it is missing.
inline nlohmann::json read_attr(hid_t loc, const std::string& name, const std::string& file) {
  check(H5Aexists(loc, name.c_str()) > 0, file, ": attribute '", name, "' is missing");
  Handle a(H5Aopen(loc, name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(a.id), H5Tclose);
  switch (H5Tget_class(type.id)) {
    case H5T_INTEGER: {
      int64_t x = 0;
      check(H5Aread(a.id, H5T_NATIVE_INT64, &x) >= 0, file, ": cannot read attribute ", name);
      return x;
    }
    case H5T_FLOAT: {
      double x = 0;
      check(H5Aread(a.id, H5T_NATIVE_DOUBLE, &x) >= 0, file, ": cannot read attribute ", name);
      return x;
    }
    case H5T_STRING: {
      char* text = nullptr;
      Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
      H5Tset_size(mem.id, H5T_VARIABLE);
      H5Tset_cset(mem.id, H5T_CSET_UTF8);
      check(H5Aread(a.id, mem.id, &text) >= 0, file, ": cannot read attribute ", name);
      std::string s = text ? text : "";
      H5free_memory(text);
      return s;
    }
    default:
      fail(file, ": attribute '", name, "' has an unexpected type");
  }
}

}  // namespace megabatch::io
