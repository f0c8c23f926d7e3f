#include "core/io/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/io/h5.h"
#include "core/util/error.h"
#include "core/util/files.h"
#include "core/util/json.h"
#include "core/util/numbers.h"

namespace megabatch::io {
namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "megabatch checkpoint";
// 2: every tensor carries HDF5's Fletcher-32 checksum (of each chunk), verified by every
// read, and the file's metadata (object headers, attributes) the checksums of HDF5 1.10's
// format. Version 1 (no checksums) still loads.
constexpr int64_t kFormatVersion = 2;
constexpr int64_t kOldestReadable = 1;
// Chunks of at most this many elements (4 MiB of f32): each carries its own checksum.
constexpr hsize_t kChunkElements = hsize_t{1} << 20;
constexpr const char* kLatest = "latest_checkpointed_iteration.txt";

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Parameter i's whole (TP-local) fp32 master: from `masters` where the caller holds them
// (the distributed optimizer's), else the store's.
Tensor master_of(const nn::ParameterStore& store, const std::vector<Tensor>* masters, size_t i) {
  if (!masters) return store.master(static_cast<int>(i));
  check(masters->size() == store.count(), "internal error: ", masters->size(), " masters for ", store.count(),
        " parameters");
  return (*masters)[i];
}

// The full tensor of a (possibly sharded) parameter-sized fp32 tensor (on any device), on
// every rank.
std::vector<float> gather_full(const nn::ParamInfo& info, const Tensor& local_t, comm::Communicator& tp) {
  std::vector<float> local = to_host_f32(local_t);  // not const: returned by move
  if (!info.sharding.sharded || tp.size() == 1) return local;
  const size_t full = static_cast<size_t>(info.full_numel());
  std::vector<float> out(full);
  std::vector<float> gathered(info.numel * static_cast<size_t>(tp.size()));
  tp.all_gather(local.data(), gathered.data(), info.numel);
  // gathered holds rank 0's shard, then rank 1's, ...; place each element at its index in
  // the full tensor (the shard's full_index map, shifted to that rank).
  nn::ParamInfo shard = info;
  for (int r = 0; r < tp.size(); ++r) {
    shard.sharding.tp_rank = r;
    for (size_t i = 0; i < info.numel; ++i)
      out[static_cast<size_t>(shard.full_index(static_cast<int64_t>(i)))] = gathered[static_cast<size_t>(r) * info.numel + i];
  }
  return out;
}

// The full tensor of a plugin state buffer of any shape, on every rank: replicated state is
// this rank's (every rank holds the same), split state is gathered and placed.
std::vector<float> gather_state(const optim::PluginState& s, comm::Communicator& tp) {
  std::vector<float> local = to_host_f32(s.tensor);  // not const: returned by move
  if (s.partition_dim < 0 || tp.size() == 1) return local;
  const size_t n = local.size();
  std::vector<float> gathered(n * static_cast<size_t>(tp.size())), out(gathered.size());
  tp.all_gather(local.data(), gathered.data(), n);
  for (int r = 0; r < tp.size(); ++r)
    for (size_t i = 0; i < n; ++i)
      out[static_cast<size_t>(s.full_index(static_cast<int64_t>(i), r, tp.size()))] = gathered[static_cast<size_t>(r) * n + i];
  return out;
}

// A tensor as a chunked dataset whose chunks carry Fletcher-32 checksums (HDF5's own
// filter: h5py and h5dump verify them as well). Chunks are whole rows, up to kChunkElements.
void write_tensor(hid_t file, const std::string& name, const std::vector<float>& data, const std::vector<int64_t>& shape,
                  const std::string& path) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.id, 1);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const bool empty = dims.empty() || std::find(dims.begin(), dims.end(), hsize_t{0}) != dims.end();
  if (!empty) {  // HDF5 chunks no empty or scalar dataset (nothing there to damage)
    std::vector<hsize_t> chunk = dims;
    hsize_t row = 1;
    for (size_t k = 1; k < dims.size(); ++k) row *= dims[k];
    chunk[0] = std::max<hsize_t>(1, std::min(dims[0], kChunkElements / std::max<hsize_t>(row, 1)));
    for (size_t k = 1; k < dims.size() && row > kChunkElements; ++k)  // rows longer than a chunk: split them
      chunk[k] = std::max<hsize_t>(1, dims[k] * kChunkElements / row);
    if (H5Pset_chunk(dcpl.id, static_cast<int>(chunk.size()), chunk.data()) < 0 || H5Pset_fletcher32(dcpl.id) < 0)
      fail(path, ": cannot set up the checksum of ", name);
  }
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Handle d(H5Dcreate2(file, name.c_str(), H5T_NATIVE_FLOAT, space.id, lcpl.id, dcpl.id, H5P_DEFAULT), H5Dclose);
  const bool ok = d.id >= 0 && H5Dwrite(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) >= 0;
  if (!ok) fail(path, ": cannot write ", name, h5_os_reason());
}

// Reads a dataset of floats into `out` (its size); a chunk whose Fletcher-32 checksum does
// not match (HDF5 refuses the read, and says so on its error stack) is an Error that names
// the file and the tensor.
void read_dataset(hid_t d, std::vector<float>& out, const std::string& path, const std::string& what) {
  if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0) return;
  bool checksum = false;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* seen) -> herr_t {
        if (e->desc && std::string(e->desc).find("Fletcher32") != std::string::npos) *static_cast<bool*>(seen) = true;
        return 0;
      },
      &checksum);
  if (checksum) fail(path, ": ", what, " does not match its checksum: the file was damaged after it was written");
  fail(path, ": cannot read ", what, " (the file is damaged or cut short)");
}

// The padded vocabulary of the checkpoint's model and of this run's: tensors with one row
// per vocabulary entry (word embeddings, LM-head biases) may differ only in their padding
// rows, as when a checkpoint written at one tensor-parallel size loads at another.
struct VocabRows {
  int64_t stored = -1, model = -1;
};

// The stored shape of dataset `name` (open as d), checked against `shape`, the run's full one:
// equal, or a padded vocabulary's rows on both sides (then the stored shape differs); errors
// name the mismatch.
std::vector<int64_t> checked_shape(hid_t d, const std::vector<int64_t>& shape, const std::string& path,
                                   const std::string& what, const VocabRows& vocab,
                                   const std::string& remedy =
                                       "load it into the same model configuration (or start "
                                       "without --load)") {
  Handle space(H5Dget_space(d), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.id);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  const std::vector<int64_t> stored(dims.begin(), dims.end());
  const bool repadded = stored != shape && !stored.empty() && stored.size() == shape.size() &&
                        stored[0] == vocab.stored && shape[0] == vocab.model &&
                        std::equal(stored.begin() + 1, stored.end(), shape.begin() + 1);
  check(stored == shape || repadded, path, ": ", what, " has shape ", shape_text(stored), " in the checkpoint but ",
        shape_text(shape), " in this run; ", remedy);
  return stored;
}

// Reads dataset `name` (full shape `shape`) and returns it in `shape`; errors name the
// mismatch. A tensor whose first dimension is the padded vocabulary on both sides is
// adapted: *valid_rows gets the rows copied (the others keep their current values).
std::vector<float> read_tensor(hid_t file, const std::string& name, const std::vector<int64_t>& shape,
                               const std::string& path, const std::string& what, const VocabRows& vocab = {},
                               int64_t* valid_rows = nullptr) {
  check(H5Lexists(file, name.c_str(), H5P_DEFAULT) > 0, path, ": the checkpoint has no ", what);
  Handle d(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  const std::vector<int64_t> stored = checked_shape(d.id, shape, path, what, vocab);
  const bool repadded = stored != shape;
  if (valid_rows) *valid_rows = shape.empty() ? 0 : shape[0];
  std::vector<float> in(static_cast<size_t>(numel_of(stored)));
  read_dataset(d.id, in, path, what);
  if (!repadded) return in;
  int64_t row = 1;
  for (size_t k = 1; k < shape.size(); ++k) row *= shape[k];
  const int64_t rows = std::min(stored[0], shape[0]);
  std::vector<float> out(static_cast<size_t>(shape[0] * row), 0.0f);
  std::copy(in.begin(), in.begin() + rows * row, out.begin());
  if (valid_rows) *valid_rows = rows;
  return out;
}

// What to do about a checkpoint whose parameters are not this model's (by name or shape): the
// settings its recorded model has otherwise than the run's (`ours`, where given), else its
// whole recorded model. (Their tensor-parallel size and vocabulary padding may differ: the
// stored tensors are whole, and padding rows adapt. A GPT's or BERT's decoder sizes are its
// layers' and sequence's.)
std::string model_remedy(const nlohmann::json& theirs, const nlohmann::json& ours) {
  std::string differ;
  if (theirs.is_object() && ours.is_object())
    for (const auto& [key, value] : ours.items()) {
      const bool decoder_of_gpt_or_bert = key.rfind("decoder_", 0) == 0 && ours.value("family", "") != "t5";
      if (key == "tensor_model_parallel_size" || key == "padded_vocab_size" || key == "make_vocab_size_divisible_by" ||
          decoder_of_gpt_or_bert || !theirs.contains(key) || theirs[key] == value)
        continue;
      differ += differ.empty() ? "" : ", ";
      differ += key + " " + theirs[key].dump() + " (this run: " + value.dump() + ")";
    }
  if (differ.empty()) return "its model was " + theirs.dump() + "; load it into the same model configuration";
  return "its model has " + differ +
         "; give the model flags it was trained with (or --use-checkpoint-args in their place, which takes them from "
         "the checkpoint)";
}

// Names of the members of group `name` (empty when it does not exist).
std::vector<std::string> members(hid_t file, const std::string& name) {
  std::vector<std::string> out;
  if (H5Lexists(file, name.c_str(), H5P_DEFAULT) <= 0) return out;
  Handle g(H5Gopen2(file, name.c_str(), H5P_DEFAULT), H5Gclose);
  H5G_info_t info{};
  H5Gget_info(g.id, &info);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t n = H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string s(static_cast<size_t>(n), '\0');
    H5Lget_name_by_idx(g.id, ".", H5_INDEX_NAME, H5_ITER_INC, i, s.data(), s.size() + 1, H5P_DEFAULT);
    out.push_back(s);
  }
  return out;
}

void fsync_path(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::optional<int64_t> iteration_of(const fs::path& file) {
  const std::string f = file.filename().string();
  if (f.size() != 15 || f.rfind("iter_", 0) != 0 || f.substr(12) != ".h5") return std::nullopt;
  int64_t it = 0;
  for (char c : f.substr(5, 7)) {
    if (c < '0' || c > '9') return std::nullopt;
    it = it * 10 + (c - '0');
  }
  return it;
}

// The directories dir/earlier/N that set_aside_later_checkpoints made (real ones, no symlink).
std::vector<fs::path> set_aside_dirs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!is_real_dir(dir / kSetAsideDir)) return out;
  for (const auto& e : fs::directory_iterator(dir / kSetAsideDir, ec))
    if (is_real_dir(e.path())) out.push_back(e.path());
  return out;
}

// The checkpoint files remove_old_checkpoints(dir, kept) removes, with their sizes.
std::vector<std::pair<fs::path, int64_t>> old_checkpoints(const fs::path& dir, Kept kept) {
  std::vector<std::pair<fs::path, int64_t>> out;
  std::error_code ec;
  auto add = [&](const fs::path& file) {
    if (fs::symlink_status(file, ec).type() != fs::file_type::regular) return;
    const auto size = fs::file_size(file, ec);
    if (!ec) out.emplace_back(file, static_cast<int64_t>(size));
  };
  const auto all = list_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(std::max(kept.newest, 0)) < all.size(); ++i)
    if (kept.every <= 0 || all[i].first % kept.every != 0) add(all[i].second);  // else retained
  if (kept.set_aside)
    for (const auto& earlier : set_aside_dirs(dir))
      for (const auto& [it, file] : list_checkpoints(earlier)) add(file);
  return out;
}

}  // namespace

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (auto it = iteration_of(e.path())) out.emplace_back(*it, e.path());
  std::sort(out.begin(), out.end());
  return out;
}

void remove_unfinished_checkpoints(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 4 || name.substr(name.size() - 4) != ".tmp" || e.is_symlink()) continue;
    const fs::path finished = e.path().parent_path() / name.substr(0, name.size() - 4);
    if (iteration_of(finished) || finished.filename() == kLatest) fs::remove(e.path(), ec);
  }
}

int64_t remove_old_checkpoints(const fs::path& dir, Kept kept) {
  int64_t freed = 0;
  std::error_code ec;
  for (const auto& [path, size] : old_checkpoints(dir, kept))
    if (fs::remove(path, ec) && !ec) freed += size;
  if (kept.newest <= 0) fs::remove(dir / kLatest, ec);
  if (kept.set_aside) {  // each directory left empty (fs::remove leaves one that is not)
    for (const auto& earlier : set_aside_dirs(dir)) fs::remove(earlier, ec);
    if (is_real_dir(dir / kSetAsideDir)) fs::remove(dir / kSetAsideDir, ec);
  }
  return freed;
}

int64_t old_checkpoint_bytes(const fs::path& dir, Kept kept) {
  int64_t bytes = 0;
  for (const auto& [path, size] : old_checkpoints(dir, kept)) bytes += size;
  return bytes;
}

fs::path checkpoint_path(const fs::path& dir, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld.h5", static_cast<long long>(iteration));
  return dir / name;
}

SetAside set_aside_later_checkpoints(const fs::path& dir, int64_t iteration) {
  SetAside out;
  const auto all = list_checkpoints(dir);
  std::error_code ec;
  for (const auto& [it, path] : all) {
    if (it <= iteration || fs::symlink_status(path, ec).type() != fs::file_type::regular) continue;
    if (out.to.empty()) {
      out.to = first_free_numbered(dir / kSetAsideDir);
      fs::create_directories(out.to, ec);
      check(!ec, out.to.string(), ": cannot create it to set aside the checkpoints past iteration ", iteration, " (",
            ec.message(), ")");
    }
    const auto size = fs::file_size(path, ec);
    out.bytes += ec ? 0 : static_cast<int64_t>(size);
    fs::rename(path, out.to / path.filename(), ec);
    check(!ec, path.string(), ": cannot move it to ", out.to.string(), " (", ec.message(), ")");
    out.iterations.push_back(it);
  }
  if (out.iterations.empty()) return out;
  fsync_path(out.to, O_RDONLY | O_DIRECTORY);
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
  // the latest file: the newest left up to `iteration` (it may name a moved one), or none
  std::optional<int64_t> newest;
  for (const auto& [it, path] : list_checkpoints(dir))
    if (it <= iteration) newest = it;
  if (!newest) {
    fs::remove(dir / kLatest, ec);
  } else {
    AtomicFile latest(dir / kLatest);
    const std::string text = std::to_string(*newest) + "\n";
    latest.write(text.data(), text.size());
    latest.commit();
  }
  return out;
}

std::optional<fs::path> latest_checkpoint(const fs::path& dir) {
  const fs::path latest = dir / kLatest;
  if (fs::is_regular_file(latest)) {  // what save_checkpoint wrote: one iteration number and a newline
    std::string text = read_file(latest, "latest checkpoint file");
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    const std::optional<int64_t> it = parse_int(text);
    check(it && *it >= 0, latest.string(), ": '", text.substr(0, 40), "' is not an iteration number (it was damaged); ",
          "remove it to fall back to the newest checkpoint present");
    const fs::path p = checkpoint_path(dir, *it);
    check(fs::exists(p), latest.string(), " names iteration ", *it, " but ", p.string(),
          " is missing; remove the latest file to fall back to the newest checkpoint present");
    return p;
  }
  const auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

namespace {
// The checkpoint's header: its format and the run's state, as attributes of the file.
void write_header(hid_t f, const CheckpointState& state, const std::string& p) {
  write_attr(f, "format", kFormat, p);
  write_attr(f, "format_version", kFormatVersion, p);
  write_attr(f, "iteration", state.iteration, p);
  write_attr(f, "consumed_samples", state.consumed_samples, p);
  write_attr(f, "seed", static_cast<int64_t>(state.seed), p);
  write_attr(f, "loss_scale", state.loss_scale, p);
  write_attr(f, "model", state.model.dump(), p);
  write_attr(f, "optimizer", state.optimizer, p);
  write_attr(f, "optimizer_version", state.optimizer_version, p);
  write_attr(f, "optimizer_params", state.optimizer_params.dump(), p);
  write_attr(f, "trainer", state.trainer.dump(), p);
  if (!state.data.is_null()) write_attr(f, "data", state.data.dump(), p);
}

// Writes `tmp` (on the writer, rank 0 of the tensor-parallel group; every rank of the group
// takes part in gathering the tensors).
void write_unfinished(const fs::path& tmp, bool writer, const CheckpointState& state, nn::ParameterStore& store,
                      comm::Communicator& tp, const OptimizerState* optimizer, const std::vector<Tensor>* masters) {
  // HDF5 1.10's format: checksums on the metadata (object headers and their attributes) too
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_libver_bounds(fapl.id, H5F_LIBVER_V110, H5F_LIBVER_V110);
  Handle f(writer ? H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id) : -1, H5Fclose);
  if (writer) {
    check(f.id >= 0, tmp.string(), ": cannot create the checkpoint (is the directory writable?)");
    write_header(f.id, state, tmp.string());
  }
  for (size_t i = 0; i < store.count(); ++i) {
    const nn::ParamInfo& info = store.info(static_cast<int>(i));
    const auto full = gather_full(info, master_of(store, masters, i), tp);  // fp32, whatever the run's dtype
    if (!writer) continue;
    const std::string name = "params/" + info.name;
    write_tensor(f.id, name, full, info.full_shape, tmp.string());
    Handle d(H5Dopen2(f.id, name.c_str(), H5P_DEFAULT), H5Dclose);
    write_attr(d.id, "role", static_cast<int64_t>(info.role), tmp.string());
    write_attr(d.id, "sharded", static_cast<int64_t>(info.sharding.sharded), tmp.string());
    write_attr(d.id, "partition_dim", static_cast<int64_t>(info.sharding.partition_dim), tmp.string());
  }
  if (optimizer) {
    for (const auto& [key, s] : *optimizer) {
      if (!s.checkpointed) continue;
      const auto full = gather_state(s, tp);
      if (writer)
        write_tensor(f.id, "optimizer/" + key.first + "/" + key.second, full, s.full_shape(tp.size()), tmp.string());
    }
  }
  if (!writer) return;
  if (H5Fflush(f.id, H5F_SCOPE_GLOBAL) < 0) fail(tmp.string(), ": cannot flush", h5_os_reason());
  const herr_t closed = H5Fclose(f.id);
  f.id = -1;
  if (closed < 0) fail(tmp.string(), ": cannot close", h5_os_reason());
}

// The finished file into place, durably, then latest_checkpointed_iteration.txt; what `kept`
// says kept (kept.newest 0: all).
void publish(const fs::path& tmp, const fs::path& final_path, const fs::path& dir, int64_t iteration, Kept kept) {
  fsync_path(tmp, O_RDONLY);
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  check(!ec, final_path.string(), ": cannot rename the finished checkpoint into place (", ec.message(), ")");
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
  AtomicFile latest(dir / kLatest);
  const std::string text = std::to_string(iteration) + "\n";
  latest.write(text.data(), text.size());
  latest.commit();
  if (kept.newest > 0) remove_old_checkpoints(dir, kept);
}
}  // namespace

fs::path save_checkpoint(const fs::path& dir, const CheckpointState& state, nn::ParameterStore& store,
                         comm::Communicator& tp, const OptimizerState* optimizer, Kept kept,
                         const std::vector<Tensor>* masters) {
  silence_hdf5();
  const fs::path final_path = checkpoint_path(dir, state.iteration);
  const fs::path tmp = final_path.string() + ".tmp";
  const bool writer = tp.rank() == 0;
  if (writer) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    check(!ec, dir.string(), ": cannot create the checkpoint directory (", ec.message(), ")");
  }
  // On any failure (a full disk: HDF5's errors name the file) the unfinished file is removed
  // and the previous checkpoints stay as they were.
  try {
    write_unfinished(tmp, writer, state, store, tp, optimizer, masters);
  } catch (const Error& e) {
    std::error_code ec;
    if (!writer) throw;
    fs::remove(tmp, ec);
    const auto older = list_checkpoints(dir);
    throw Error(std::string(e.what()) + "; removed the unfinished file" +
                (older.empty() ? std::string("")
                               : ", the checkpoint of iteration " + std::to_string(older.back().first) +
                                     " is intact (resume from it with --load " + dir.string() + ")"));
  } catch (...) {
    std::error_code ec;
    if (writer) fs::remove(tmp, ec);
    throw;
  }
  if (writer) publish(tmp, final_path, dir, state.iteration, kept);
  tp.barrier();
  return final_path;
}

CheckpointState read_checkpoint_state(const fs::path& file) {
  silence_hdf5();
  const std::string p = file.string();
  Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.id < 0) {
    const std::string cut = h5_truncation();  // "" for a missing file
    fail(p, !fs::exists(file) ? ": missing" : cut.empty() ? ": not a readable HDF5 file" : ": " + cut,
         kDamagedCheckpoint);
  }
  check(H5Aexists(f.id, "format") > 0 && read_attr(f.id, "format", p) == kFormat, p, ": not a megabatch checkpoint",
        kDamagedCheckpoint);
  // Each attribute with the type save_checkpoint gave it: a hand-edited or damaged one is
  // refused naming the attribute, not met later as a JSON library's type error.
  const char* damaged = kDamagedCheckpoint;
  auto integer = [&](const char* name, bool counts) {
    const nlohmann::json v = read_attr(f.id, name, p);
    check(v.is_number_integer() && (!counts || v.get<int64_t>() >= 0), p, ": attribute '", name, "' is ", v.dump(),
          counts ? ", not an integer >= 0" : ", not an integer", damaged);
    return v.get<int64_t>();
  };
  auto text = [&](const char* name) {
    const nlohmann::json v = read_attr(f.id, name, p);
    check(v.is_string(), p, ": attribute '", name, "' is ", v.dump(), ", not a string", damaged);
    return v.get<std::string>();
  };
  auto object = [&](const char* name) {
    auto v = parse_json_or_fail(text(name), p + ": attribute '" + name + "'", damaged);
    check(v.is_object(), p, ": attribute '", name, "' is ", v.dump(), ", not a JSON object", damaged);
    return v;
  };
  const int64_t version = integer("format_version", true);
  check(version >= kOldestReadable && version <= kFormatVersion, p, ": checkpoint format version ", version,
        " but this megabatch reads versions ", kOldestReadable, " to ", kFormatVersion);
  CheckpointState s;
  s.file = file;
  s.checksummed = version >= 2;
  s.iteration = integer("iteration", true);
  s.consumed_samples = integer("consumed_samples", true);
  s.seed = static_cast<uint64_t>(integer("seed", false));  // a uint64 stored as int64 bits
  const nlohmann::json scale = read_attr(f.id, "loss_scale", p);
  check(scale.is_number() && scale.get<double>() > 0, p, ": attribute 'loss_scale' is ", scale.dump(),
        ", not a number > 0", damaged);
  s.loss_scale = scale.get<double>();
  s.model = object("model");
  check(!s.model.contains("padded_vocab_size") || s.model["padded_vocab_size"].is_number_integer(), p,
        ": attribute 'model': padded_vocab_size is ", s.model.value("padded_vocab_size", nlohmann::json()).dump(),
        ", not an integer", damaged);
  if (s.model.contains("tokenizer")) {  // since the tokenizer record: what its embedding rows stand for
    const nlohmann::json& t = s.model["tokenizer"];
    check(t.is_object() && t.contains("tokenizer_type") && t["tokenizer_type"].is_string() &&
              t.contains("vocab_fingerprint") && t["vocab_fingerprint"].is_string(),
          p, ": attribute 'model': tokenizer is ", t.dump(),
          ", not an object of a tokenizer_type and a vocab_fingerprint string", damaged);
  }
  s.optimizer = text("optimizer");
  s.optimizer_version = text("optimizer_version");
  s.optimizer_params = object("optimizer_params");
  s.trainer = object("trainer");
  if (H5Aexists(f.id, "data") > 0) s.data = object("data");
  return s;
}

void check_checkpoint_matches(const fs::path& file, const nn::ParameterStore& store,
                              const std::string& expected_optimizer, int64_t expected_padded_vocab,
                              const nlohmann::json& run_model) {
  const CheckpointState state = read_checkpoint_state(file);
  const std::string p = file.string();
  Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  check(f.id >= 0, p, ": cannot open the checkpoint");
  std::vector<std::string> stored = members(f.id, "params");
  const VocabRows vocab{state.model.value("padded_vocab_size", int64_t{-1}), expected_padded_vocab};
  const std::string remedy = model_remedy(state.model, run_model);
  for (size_t i = 0; i < store.count(); ++i) {
    const nn::ParamInfo& info = store.info(static_cast<int>(i));
    const std::string name = "params/" + info.name;
    check(H5Lexists(f.id, name.c_str(), H5P_DEFAULT) > 0, p, ": this model has parameter '", info.name,
          "' that the checkpoint lacks; ", remedy);
    Handle d(H5Dopen2(f.id, name.c_str(), H5P_DEFAULT), H5Dclose);
    check(d.id >= 0, p, ": cannot open parameter '", info.name, "' (the file is damaged)");
    checked_shape(d.id, info.full_shape, p, "parameter '" + info.name + "'", vocab, remedy);
    stored.erase(std::remove(stored.begin(), stored.end(), info.name), stored.end());
  }
  check(stored.empty(), p, ": the checkpoint has parameter '", stored.empty() ? "" : stored.front(),
        "' that this model lacks (", stored.size(), " in all); ", remedy);
  check(expected_optimizer.empty() || state.optimizer == expected_optimizer, p,
        ": the checkpoint's optimizer state is from plugin '", state.optimizer, "' but this run uses '",
        expected_optimizer, "'; resume with --optimizer ", state.optimizer,
        ", or load only the model with --no-load-optim");
}

void load_checkpoint(const fs::path& file, nn::ParameterStore& store, OptimizerState* optimizer,
                     const std::string& expected_optimizer, int64_t expected_padded_vocab, std::vector<Tensor>* masters,
                     const nlohmann::json& run_model) {
  check_checkpoint_matches(file, store, optimizer ? expected_optimizer : std::string(), expected_padded_vocab,
                           run_model);
  const CheckpointState state = read_checkpoint_state(file);
  const std::string p = file.string();
  Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  check(f.id >= 0, p, ": cannot open the checkpoint");
  const VocabRows vocab{state.model.value("padded_vocab_size", int64_t{-1}), expected_padded_vocab};
  // element j of a parameter-shaped tensor: copy from the checkpoint unless its row is a
  // padding row the checkpoint does not have
  auto copy_in = [](const nn::ParamInfo& info, const std::vector<float>& full, int64_t valid_rows, const Tensor& dst) {
    const int64_t row = info.full_shape.size() > 1 ? info.full_shape[1] : 1;
    std::vector<float> local = to_host_f32(dst);
    for (size_t j = 0; j < info.numel; ++j) {
      const int64_t at = info.full_index(static_cast<int64_t>(j));
      if (at / row < valid_rows) local[j] = full[static_cast<size_t>(at)];
    }
    copy(dst, from_host(local, dst.shape(), DType::kF32, dst.device()));
  };
  for (size_t i = 0; i < store.count(); ++i) {
    const nn::ParamInfo& info = store.info(static_cast<int>(i));
    int64_t valid = 0;
    const auto full = read_tensor(f.id, "params/" + info.name, info.full_shape, p, "parameter '" + info.name + "'", vocab, &valid);
    copy_in(info, full, valid, master_of(store, masters, i));
  }
  if (!masters) store.copy_masters_to_params();
  if (!optimizer) return;
  const nn::ParamInfo& any = store.info(0);
  const int tp_size = any.sharding.tp_size, tp_rank = any.sharding.tp_rank;
  for (auto& [key, s] : *optimizer) {
    if (!s.checkpointed) continue;
    const std::vector<int64_t> shape = s.full_shape(tp_size);
    int64_t valid = 0;
    const auto full = read_tensor(f.id, "optimizer/" + key.first + "/" + key.second, shape, p,
                                  "optimizer state '" + key.second + "' of " + key.first, vocab, &valid);
    // this rank's slice (rows past `valid` of a re-padded vocabulary keep their values)
    int64_t row = 1;
    for (size_t k = 1; k < shape.size(); ++k) row *= shape[k];
    std::vector<float> local = to_host_f32(s.tensor);
    for (size_t j = 0; j < local.size(); ++j) {
      const int64_t at = s.full_index(static_cast<int64_t>(j), tp_rank, tp_size);
      if (at / row < valid) local[j] = full[static_cast<size_t>(at)];
    }
    copy(s.tensor, from_host(local, s.tensor.shape(), DType::kF32, s.tensor.device()));
  }
}

std::optional<std::string> checkpoint_damage(const fs::path& file) {
  try {
    silence_hdf5();
    (void)read_checkpoint_state(file);
    const std::string p = file.string();
    Handle f(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    check(f.id >= 0, p, ": cannot open the checkpoint", kDamagedCheckpoint);
    // every dataset under params/ and optimizer/ (optimizer/<parameter>/<state>), read whole
    std::vector<std::string> pending = {"params", "optimizer"};
    while (!pending.empty()) {
      const std::string name = pending.back();
      pending.pop_back();
      if (H5Lexists(f.id, name.c_str(), H5P_DEFAULT) <= 0) continue;
      H5O_info_t info{};
      check(H5Oget_info_by_name2(f.id, name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0, p, ": cannot read ", name,
            " (the file is damaged)");
      if (info.type == H5O_TYPE_GROUP) {
        for (const auto& m : members(f.id, name)) pending.push_back(name + "/" + m);
        continue;
      }
      Handle d(H5Dopen2(f.id, name.c_str(), H5P_DEFAULT), H5Dclose);
      check(d.id >= 0, p, ": cannot open tensor ", name, " (the file is damaged)");
      Handle space(H5Dget_space(d.id), H5Sclose);
      std::vector<float> data(static_cast<size_t>(std::max<hssize_t>(H5Sget_simple_extent_npoints(space.id), 0)));
      read_dataset(d.id, data, p, "tensor '" + name + "'");
    }
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

std::optional<fs::path> newest_intact_checkpoint(const fs::path& dir, int64_t before_iteration) {
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->first < before_iteration && !checkpoint_damage(it->second)) return it->second;
  return std::nullopt;
}

std::optional<int64_t> checkpoint_iteration(const fs::path& file) { return iteration_of(file); }

}  // namespace megabatch::io
