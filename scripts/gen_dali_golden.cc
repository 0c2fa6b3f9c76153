// scripts/gen_dali_golden.cc — golden sample streams for tests/test_pipeline.c.
//
// A line-by-line mirror of NVIDIA DALI's reader logic — Loader::ReadOne,
// IncreaseReadSampleCounter, IsNextShard(Relative), ShouldPadBatch
// (dali/operators/reader/loader/loader.h), start_index / num_samples
// (loader.cc) and FileLabelLoader's PrepareMetadataImpl / ReadSample / Reset
// (file_label_loader.h) — with the sample reduced to its listing index. It is
// not DALI itself (DALI is not packaged for Debian); it runs the real C++
// standard library (std::default_random_engine + std::seed_seq,
// std::uniform_int_distribution, std::mt19937, std::shuffle) that DALI's code
// calls, so it checks Tessera's C ports of those streams as well as the state
// machine. Batches are formed as DALI's reader does: ReadOne(i == 0, i == B - 1)
// for i in [0, B).
//
//   g++ -std=c++17 -O2 -o /tmp/gen_dali_golden scripts/gen_dali_golden.cc
//   /tmp/gen_dali_golden > tests/golden/dali_reader.txt
//
// Each output line: N S shard_id B stick_to_shard pad_last_batch random_shuffle
// initial_fill shuffle_after_epoch seed count ':' then `count` listing indices;
// an index followed by '|' ends an epoch (IsEpochDepleted() &&
// !ShouldPadBatch(is_end_of_batch), the point where DALI's checkpointing
// advances consumer_epoch_).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <random>
#include <utility>
#include <vector>

typedef int64_t Index;
static const int kDaliDataloaderSeed = 524287;

static size_t start_index(size_t shard_id, size_t shard_num, size_t size) { return size * shard_id / shard_num; }
static Index num_samples(size_t shard_num, size_t size) { return (Index)std::ceil(size * 1.0 / shard_num); }

struct Mirror {
  // options
  bool shuffle_; int initial_buffer_fill_; Index seed_; int shard_id_, num_shards_;
  bool stick_to_shard_, pad_last_batch_, shuffle_after_epoch_;
  // Loader
  std::default_random_engine e_;
  int virtual_shard_id_;
  struct Entry { Index idx; Index sample; };
  std::vector<Entry> sample_buffer_;
  struct ShardBoundaries { Index start, end; };
  std::deque<ShardBoundaries> shards_;
  bool initial_buffer_filled_ = false;
  Index read_sample_counter_ = 0, total_read_sample_counter_ = 0, returned_sample_counter_ = 0;
  Entry last_sample_ptr_tmp{0, 0};
  // FileLabelLoader
  std::vector<Index> image_label_pairs_;
  Index current_index_ = 0;
  int current_epoch_ = 0;

  Mirror(Index n, int S, int shard, bool stick, bool pad, bool shuffle, int fill, bool sae, Index seed)
      : shuffle_(shuffle), initial_buffer_fill_(shuffle ? fill : 1), seed_(seed), shard_id_(shard), num_shards_(S),
        stick_to_shard_(stick), pad_last_batch_(pad), shuffle_after_epoch_(sae) {
    std::seed_seq seq({seed_});
    e_ = std::default_random_engine(seq);
    virtual_shard_id_ = shard_id_;
    if (shuffle_after_epoch_) stick_to_shard_ = true;
    for (Index i = 0; i < n; i++) image_label_pairs_.push_back(i);
    // PrepareMetadataImpl
    if (shuffle_) {
      std::mt19937 g(kDaliDataloaderSeed);
      std::shuffle(image_label_pairs_.begin(), image_label_pairs_.end(), g);
    }
    Reset(true);
  }
  Index Size() { return (Index)image_label_pairs_.size(); }
  void Reset(bool wrap_to_shard) {
    current_index_ = wrap_to_shard ? (Index)start_index(virtual_shard_id_, num_shards_, Size()) : 0;
    current_epoch_++;
    if (shuffle_after_epoch_) {
      std::mt19937 g(kDaliDataloaderSeed + current_epoch_);
      std::shuffle(image_label_pairs_.begin(), image_label_pairs_.end(), g);
    }
  }
  bool IsNextShard(Index current_index) {
    return current_index >= Size() ||
           (stick_to_shard_ && shard_id_ + 1 < num_shards_ &&
            current_index >= static_cast<Index>(start_index(shard_id_ + 1, num_shards_, Size())));
  }
  void MoveToNextShard(Index current_index) {
    if (IsNextShard(current_index)) Reset(stick_to_shard_);
  }
  Index ReadSample() {
    Index entry = image_label_pairs_[current_index_++];
    MoveToNextShard(current_index_);
    return entry;
  }
  bool IsNextShardRelative(Index already_read, int virtual_shard_id) {
    Index current_index = already_read + static_cast<Index>(start_index(virtual_shard_id, num_shards_, Size()));
    return current_index >= Size() ||
           (virtual_shard_id + 1 < num_shards_ &&
            current_index >= static_cast<Index>(start_index(virtual_shard_id + 1, num_shards_, Size())));
  }
  void IncreaseReadSampleCounter() {
    ++read_sample_counter_;
    ++total_read_sample_counter_;
    if (IsNextShardRelative(read_sample_counter_ - 1, virtual_shard_id_)) {
      if (!stick_to_shard_) ++virtual_shard_id_;
      read_sample_counter_ = 1;
      if (virtual_shard_id_ == num_shards_) virtual_shard_id_ = 0;
      Index curr_elms = shards_.back().end;
      shards_.push_back({curr_elms, curr_elms});
    }
  }
  bool ShouldPadBatch(bool is_new_batch) {
    return (returned_sample_counter_ < num_samples(num_shards_, Size()) || !is_new_batch) && pad_last_batch_;
  }
  bool IsEpochDepleted() { return shards_.size() == 0 || shards_.front().start == shards_.front().end; }
  Index ReadOne(bool is_new_batch, bool is_end_of_batch, bool *epoch_end) {
    if (!initial_buffer_filled_) {
      shards_.push_back({0, 0});
      for (int i = 0; i < initial_buffer_fill_; ++i) {
        Index s = ReadSample();
        sample_buffer_.push_back({total_read_sample_counter_, s});
        IncreaseReadSampleCounter();
        ++shards_.back().end;
      }
      initial_buffer_filled_ = true;
    }
    if (shards_.front().start == shards_.front().end) {
      if (ShouldPadBatch(is_new_batch)) {
        ++returned_sample_counter_;
        *epoch_end = !ShouldPadBatch(is_end_of_batch);
        return last_sample_ptr_tmp.sample;
      }
      shards_.pop_front();
      returned_sample_counter_ = 0;
    }
    std::uniform_int_distribution<> dis;
    dis = std::uniform_int_distribution<>(0, shards_.front().end - shards_.front().start - 1);
    int offset = shuffle_ ? dis(e_) : 0;
    Index idx = (shards_.front().start + offset) % sample_buffer_.size();
    std::swap(sample_buffer_[idx], sample_buffer_[shards_.front().start % sample_buffer_.size()]);
    Index s = ReadSample();
    Entry sample = {total_read_sample_counter_, s};
    IncreaseReadSampleCounter();
    std::swap(sample_buffer_[shards_.back().end % sample_buffer_.size()], sample);
    ++shards_.back().end;
    last_sample_ptr_tmp = sample;
    shards_.front().start++;
    returned_sample_counter_++;
    *epoch_end = IsEpochDepleted() && !ShouldPadBatch(is_end_of_batch);
    return sample.sample;
  }
};

static void emit(Index n, int S, int shard, int B, bool stick, bool pad, bool shuffle, int fill, bool sae,
                 Index seed, int count) {
  Mirror m(n, S, shard, stick, pad, shuffle, fill, sae, seed);
  printf("%lld %d %d %d %d %d %d %d %d %lld %d :", (long long)n, S, shard, B, stick, pad, shuffle, fill, sae,
         (long long)seed, count);
  for (int i = 0; i < count; i++) {
    bool end = false;
    Index s = m.ReadOne(i % B == 0, i % B == B - 1, &end);
    printf(" %lld%s", (long long)s, end ? "|" : "");
  }
  printf("\n");
}

int main() {
  // Sharding, rotation and padding without shuffling: many (N, S), every shard, 3+ epochs.
  const int Ns[] = {1, 2, 3, 5, 7, 10, 13, 16, 31, 50};
  const int Ss[] = {1, 2, 3, 4, 7, 8};
  for (int n : Ns)
    for (int S : Ss) {
      if (S > n) continue;
      for (int shard = 0; shard < S; shard++)
        for (int B : {1, 3, 4})
          for (int stick = 0; stick < 2; stick++)
            for (int pad = 0; pad < 2; pad++) {
              int per_epoch = (int)((num_samples(S, n) + B - 1) / B * B);
              emit(n, S, shard, B, stick, pad, false, 1, false, 0, 3 * per_epoch + 2);
            }
    }
  // The shuffling buffer (random_shuffle) and shuffle_after_epoch, with seeds.
  for (int n : {7, 20, 61})
    for (int S : {1, 2, 3})
      for (int shard = 0; shard < S; shard++)
        for (int fill : {1, 4, 16, 1024})
          for (int pad = 0; pad < 2; pad++)
            for (long long seed : {42LL, -1LL, 123456789012LL}) {
              if (seed != 42 && fill != 16) continue;
              int B = 4, per_epoch = (int)((num_samples(S, n) + B - 1) / B * B);
              emit(n, S, shard, B, false, pad, true, fill, false, seed, 3 * per_epoch);
            }
  for (int n : {5, 64, 150})
    for (int S : {1, 2, 4})
      for (int shard = 0; shard < S; shard++)
        for (int pad = 0; pad < 2; pad++) {
          int B = 8, per_epoch = (int)((num_samples(S, n) + B - 1) / B * B);
          emit(n, S, shard, B, false, pad, false, 1, true, 0, 3 * per_epoch);
        }
  // A list larger than 65535 entries takes std::shuffle's one-swap-per-draw path.
  emit(70000, 1, 0, 1, false, false, false, 1, true, 0, 50);
  emit(70000, 3, 2, 16, false, false, true, 8, false, 7, 50);
  return 0;
}
