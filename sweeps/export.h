// Exports of a finished (or running) sweep's metrics, runs/<name>/ -> other tools:
//
//   sweep export DIR --csv FILE          one long table: point, the swept axes, step,
//                                        samples, metric, value (one row per logged value)
//   sweep export DIR --tensorboard OUT   OUT/<point id>/events.out.tfevents.*: every
//                                        metric of every point as TensorBoard scalars
//
// Axes are the configuration keys whose values differ between the sweep's points. A
// point without metrics yet is skipped (and said so).
#pragma once

#include <filesystem>

namespace megabatch::sweeps {

int export_csv(const std::filesystem::path& sweep_dir, const std::filesystem::path& file);
int export_tensorboard(const std::filesystem::path& sweep_dir, const std::filesystem::path& out_dir);

}  // namespace megabatch::sweeps
