// Sweep points' ids: the directory name of each point, from the values of its swept keys
// (the id format: sweeps/sweep.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace megabatch::sweeps {

// The id of the point of `config`: each of `keys` it holds as <prefix><value> (bs for
// global_batch_size, lr, mbs, tp, from- for pretrained_checkpoint, the value alone for
// optimizer and model, else the key's initials; floats to 3 significant digits, a path by its
// last component, a list by its items joined by '+'), joined by '-', then -s<seed> with
// `with_seed`; made safe by safe_point_id.
std::string point_id(const nlohmann::json& config, const std::vector<std::string>& keys, bool with_seed);

// `raw` made into a point directory name: characters other than letters, digits, '-',
// '_', '.', '+' become '_', as do '..' and a leading '.'; longer than 120 characters, it is
// cut and ends with a hash of the whole.
std::string safe_point_id(const std::string& raw);

}  // namespace megabatch::sweeps
