#include "core/train/blended_source.h"

#include "core/util/error.h"

namespace megabatch::train {

BlendedSource::BlendedSource(std::vector<std::unique_ptr<BatchSource>> sources, std::vector<double> weights)
    : sources_(std::move(sources)), order_(weights) {
  check(sources_.size() == order_.size(), sources_.size(), " sources for ", order_.size(), " weights");
}

void append_samples(Batch& out, const Batch& rows) {
  check(out.batch == 0 || (out.seq == rows.seq && out.decoder_seq == rows.decoder_seq),
        "appending samples of another sequence length");
  auto add = [](auto& to, const auto& from) { to.insert(to.end(), from.begin(), from.end()); };
  add(out.tokens, rows.tokens);
  add(out.labels, rows.labels);
  add(out.padding_mask, rows.padding_mask);
  add(out.token_types, rows.token_types);
  add(out.sample_labels, rows.sample_labels);
  add(out.decoder_tokens, rows.decoder_tokens);
  add(out.decoder_padding_mask, rows.decoder_padding_mask);
  out.batch += rows.batch;
  out.seq = rows.seq;
  out.decoder_seq = rows.decoder_seq;
}

void BlendedSource::fill(uint64_t first, int64_t count, Batch& out) {
  order_.range(first, count, picked_);
  out = Batch{};
  // consecutive samples of one source in one call
  for (size_t at = 0; at < picked_.size();) {
    size_t end = at + 1;
    while (end < picked_.size() && picked_[end].first == picked_[at].first &&
           picked_[end].second == picked_[end - 1].second + 1)
      ++end;
    sources_[picked_[at].first]->fill(picked_[at].second, static_cast<int64_t>(end - at), one_);
    append_samples(out, one_);
    at = end;
  }
}

}  // namespace megabatch::train
