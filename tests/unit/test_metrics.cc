// metrics.h5's series as the exports and train --tensorboard-dir see them: 1-D series as
// they are, and each column of a 2-D series (logged step x tensor) as a series of its own
// named by the group's tensor_names, whether train wrote the names (variable-length UTF-8)
// or another writer did (fixed-length strings), with the column index where names are
// missing or do not fit.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <map>
#include <string>
#include <vector>

#include "core/io/metrics.h"
#include "tests/unit/h5_util.h"
#include "tests/unit/test_util.h"

namespace mb = megabatch;
using Series = std::map<std::string, std::vector<double>>;

namespace {

// A 1-D dataset of fixed-length (8-byte, null-padded) ASCII strings, as h5py writes
// np.array([b"..."]).
void write_fixed_strings(const std::string& path, const std::string& name, const std::vector<std::string>& values) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, 8);
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  std::vector<char> buf(values.size() * 8, '\0');
  for (size_t i = 0; i < values.size(); ++i) values[i].copy(buf.data() + i * 8, 8);
  const hsize_t n = values.size();
  hid_t space = H5Screate_simple(1, &n, nullptr);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t d = H5Dcreate2(f, name.c_str(), type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), 0);
  H5Dclose(d);
  H5Pclose(lcpl);
  H5Sclose(space);
  H5Tclose(type);
  H5Fclose(f);
}

}  // namespace

TEST(MetricsSeries, TwoDimensionalSeriesAreAColumnPerTensorForTheListenerAndTheReader) {
  mb::testing::TempDir tmp;
  const auto path = tmp / "metrics.h5";
  std::vector<Series> seen;
  {
    mb::io::MetricsFile m(path, nlohmann::json{{"lr", 0.1}});
    m.on_flush([&](const Series& rows) { seen.push_back(rows); });
    m.set_strings("optimizer/tensor_names", {"embedding.word_embeddings.weight", "layers.0.mlp.bias"});
    for (int it = 1; it <= 2; ++it) {
      m.append("train/iteration", it);
      m.append("train/lm_loss", 10.0 - it);
      m.append("optimizer/iteration", it);
      m.append_row("optimizer/trust_ratio", {0.5 * it, 2.0 * it});
    }
    m.flush();
    m.append("optimizer/iteration", 3);
    m.append_row("optimizer/trust_ratio", {1.5, 6.0});
    m.flush();
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].at("train/lm_loss"), (std::vector<double>{9.0, 8.0}));
  EXPECT_EQ(seen[0].at("optimizer/trust_ratio/embedding.word_embeddings.weight"), (std::vector<double>{0.5, 1.0}));
  EXPECT_EQ(seen[0].at("optimizer/trust_ratio/layers.0.mlp.bias"), (std::vector<double>{2.0, 4.0}));
  EXPECT_EQ(seen[0].count("optimizer/trust_ratio"), 0u) << "the 2-D series itself is not a scalar series";
  EXPECT_EQ(seen[1].at("optimizer/trust_ratio/layers.0.mlp.bias"), (std::vector<double>{6.0})) << "new rows only";

  const Series s = mb::io::read_metric_series(path);
  EXPECT_EQ(s.at("train/iteration"), (std::vector<double>{1, 2}));
  EXPECT_EQ(s.at("optimizer/iteration"), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(s.at("optimizer/trust_ratio/embedding.word_embeddings.weight"), (std::vector<double>{0.5, 1.0, 1.5}));
  EXPECT_EQ(s.at("optimizer/trust_ratio/layers.0.mlp.bias"), (std::vector<double>{2.0, 4.0, 6.0}));
  EXPECT_EQ(s.count("optimizer/trust_ratio"), 0u);
}

TEST(MetricsSeries, ColumnsAreNamedByFixedLengthNamesOrTheirIndex) {
  mb::testing::TempDir tmp;
  const auto path = (tmp / "other.h5").string();
  {
    mb::testing::H5File f(path, mb::testing::H5File::kCreate);
    f.write<double>("optimizer/iteration", {4, 8}, {2});
    f.write<double>("optimizer/update_norm", {1, 2, 3, 4}, {2, 2});
    f.write<double>("probe/iteration", {1}, {1});
    f.write<double>("probe/spectrum", {7, 8, 9}, {1, 3});  // no names in its group
  }
  write_fixed_strings(path, "optimizer/tensor_names", {"a.weight", "b.bias"});
  Series s = mb::io::read_metric_series(path);
  EXPECT_EQ(s.at("optimizer/update_norm/a.weight"), (std::vector<double>{1, 3}));
  EXPECT_EQ(s.at("optimizer/update_norm/b.bias"), (std::vector<double>{2, 4}));
  EXPECT_EQ(s.at("probe/spectrum/0"), (std::vector<double>{7}));
  EXPECT_EQ(s.at("probe/spectrum/2"), (std::vector<double>{9}));

  // names that do not fit the width (three for two columns): indices, not a misnamed column
  const auto path2 = (tmp / "misfit.h5").string();
  {
    mb::testing::H5File f(path2, mb::testing::H5File::kCreate);
    f.write<double>("optimizer/iteration", {1}, {1});
    f.write<double>("optimizer/trust_ratio", {0.25, 0.75}, {1, 2});
  }
  write_fixed_strings(path2, "optimizer/tensor_names", {"x", "y", "z"});
  s = mb::io::read_metric_series(path2);
  EXPECT_EQ(s.at("optimizer/trust_ratio/0"), (std::vector<double>{0.25}));
  EXPECT_EQ(s.at("optimizer/trust_ratio/1"), (std::vector<double>{0.75}));
  EXPECT_EQ(s.count("optimizer/trust_ratio/x"), 0u);
}

// A metrics.h5 damaged after it was written says so, naming the file and, where it opens, the
// series that does not read (before: a series whose chunk index was damaged vanished from
// what the reader returned, as if it had never been logged; plots and exports went on without
// it). metrics_unreadable, which sweep run and sweep status ask of each finished point, gives
// the same reason, and "" for an intact file.
TEST(MetricsSeries, ADamagedFileIsAnErrorNamingTheFileAndTheSeries) {
  mb::testing::TempDir tmp;
  const auto path = tmp / "metrics.h5";
  {
    mb::io::MetricsFile m(path, nlohmann::json{{"model", "gpt-mini"}});
    for (int i = 1; i <= 3; ++i) {
      m.append("train/iteration", i);
      m.append("train/lm_loss", 10.0 - i);
    }
    m.flush();
  }
  EXPECT_EQ(mb::io::metrics_unreadable(path), "");
  EXPECT_EQ(mb::io::read_metric_series(path).at("train/lm_loss"), (std::vector<double>{9, 8, 7}));
  const std::string intact = mb::testing::read_text(path);

  // the chunk index of each extendible series overwritten: a version-1 B-tree node ("TREE")
  // of type 1 (chunks; type 0 indexes a group's links)
  std::string damaged = intact;
  size_t nodes = 0;
  for (size_t at = damaged.find("TREE\1"); at != std::string::npos; at = damaged.find("TREE\1", at + 5), ++nodes)
    damaged.replace(at, 4, "XXXX");
  ASSERT_GE(nodes, 2u) << "no chunk index found to damage";
  mb::testing::write_text(path, damaged);
  const std::string series_said = path.string() + ": series train/";
  EXPECT_EQ(mb::io::metrics_unreadable(path).rfind(series_said, 0), 0u) << mb::io::metrics_unreadable(path);
  EXPECT_NE(mb::io::metrics_unreadable(path).find(" cannot be read (a damaged or cut-short copy?)"), std::string::npos);
  try {
    mb::io::read_metric_series(path);
    ADD_FAILURE() << "a damaged series read";
  } catch (const mb::Error& e) {
    EXPECT_EQ(std::string(e.what()), mb::io::metrics_unreadable(path));
  }

  // cut short, as by a copy that ran out of disk; not HDF5 at all
  mb::testing::write_text(path, intact.substr(0, intact.size() / 2));
  EXPECT_EQ(mb::io::metrics_unreadable(path), path.string() + ": cut short: " + std::to_string(intact.size() / 2) +
                                                  " of its " + std::to_string(intact.size()) + " bytes are there");
  mb::testing::write_text(path, "{\"lm_loss\": 7}\n");
  EXPECT_EQ(mb::io::metrics_unreadable(path),
            path.string() + ": cannot open as HDF5 (not a metrics.h5 written by train?)");
  // a resumed run does not continue such a file: it says what it found
  for (const auto& [bytes, found] :
       {std::pair{intact.substr(0, intact.size() / 2), "cut short: " + std::to_string(intact.size() / 2) + " of its " +
                                                           std::to_string(intact.size()) + " bytes are there"},
        std::pair{std::string("{}\n"), std::string("not an HDF5 file?")}}) {
    mb::testing::write_text(path, bytes);
    try {
      mb::io::MetricsFile continued(path, nlohmann::json{{"model", "gpt-mini"}}, 2);
      ADD_FAILURE() << "continued a damaged file";
    } catch (const mb::Error& e) {
      EXPECT_EQ(std::string(e.what()), path.string() + ": cannot open the metrics file to continue it (" + found +
                                           "); move it away to start a new one");
    }
    EXPECT_EQ(mb::testing::read_text(path), bytes) << "the damaged file is left as it was";
  }
  std::filesystem::remove(path);
  EXPECT_EQ(mb::io::metrics_unreadable(path), path.string() + ": missing");
}
