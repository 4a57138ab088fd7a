// BrandDataset: a tf.data source dataset over brand's C ABI (brand.h).
//
// The op never sees Rust types: it opens a brand_loader, pulls batches with
// brand_next and copies the samples into tensors. All loading logic (plan,
// I/O, checksums, sharding, resume) lives behind the C ABI.
//
// Inputs (all scalars, so AsGraphDefInternal can rebuild the op):
//   path        the packed dataset directory
//   config      loader TOML (built by brand_tf from its keywords)
//   epoch       first epoch to emit
//   epochs      how many consecutive epochs to emit; -1 for no end
//   batch_size  0: one element per sample; N > 0: one element per brand
//               batch (vectors of at most N), and config must say batch_size = N
//   resume_world  a vector: empty, or the brand states of EVERY rank of a
//               world of another size (elastic resume: an iterator that is not
//               restored from its own checkpoint opens with
//               brand_open_at_elastic)
//   splits      tf.data service's dynamic sharding (distributed_epoch /
//               ShardingPolicy.DYNAMIC): each epoch is cut into this many
//               splits; 0 picks from the sample count (DefaultSplits)
//
// Splits (MakeSplitProviders). Split k of S of epoch e is what rank k of a
// world of S serves of epoch e under brand's own plan (global positions
// k, k + S, ... of that epoch's order, in that order, without the padding a
// short rank gets): the S splits of an epoch hold every sample exactly once.
// A split is the int64 vector [e, k, S]. The dispatcher's provider hands out
// the epochs' splits in order; Reset (the next repetition: .repeat() over the
// dataset, or a new pass) moves on by `epochs` epochs, so each repetition is
// new epochs in new orders, the same ones again for the same seed. An
// iterator given a split provider opens each split it is handed as that
// rank (a loader of its own, brand's multi-node push off: `nodes = []`),
// serves its samples, then asks for the next split; without one it reads the
// whole configured share as before. tf.data service hands each split out at
// most once: a worker that dies mid-split loses the rest of that split for
// that epoch (no sample is served twice).
//
// Service mode: in a process where BRAND_TF_SERVICE=1 (brand.tf.service sets
// it for its dispatcher and workers) every loader is opened with
// `nodes = []` before the config, so neither the config nor the environment
// (BRAND_NODES, TF_CONFIG) makes it a node of a brand multi-node job: the
// service already moves the data. A config that sets `nodes` is refused.
//
// A second op, BrandSavedState, finds the BrandDataset iterator's brand
// state in a saved iterator state (the variant tf.train.Checkpoint writes),
// for brand.tf.saved_state.
//
// Element (a flat tuple in the order of brand_tf's element_spec dict, whose
// keys tf.nest sorts): data string, id int64, key string, label int64.
// Scalars per sample, or vectors [n] per batch.

#if !defined(TF_MAJOR_VERSION) || !defined(TF_MINOR_VERSION) || !defined(TF_PATCH_VERSION)
// The pip headers no longer define these (release_version.h #errors without
// them, dataset.h does not), so a bare #if on them would silently be 0.
#error "build with -DTF_MAJOR_VERSION=.. -DTF_MINOR_VERSION=.. -DTF_PATCH_VERSION=.. (tf-op/build.py passes them)"
#endif
#if TF_MAJOR_VERSION != 2 || TF_MINOR_VERSION < 16
// Written against the absl::Status / SerializationContext / MakeSplitProviders
// API of recent TF 2.x; older minors need source changes.
#error "BrandDataset needs TensorFlow 2.16 or newer (2.x)"
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include <cstdlib>

#include "tensorflow/core/data/serialization_utils.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/dataset.h"
#include "tensorflow/core/framework/model.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

#include "brand.h"

namespace tensorflow {
namespace data {
namespace {

constexpr char kDatasetType[] = "Brand";
// Checkpoint keys (under the iterator's prefix).
constexpr char kDone[] = "done";
constexpr char kState[] = "state";
constexpr char kPos[] = "pos";

// A brand status as an absl::Status carrying brand's own message. Must be
// called on the thread that made the failing call, right after it
// (brand_last_error is thread-local).
absl::Status BrandError(int32_t st, const char* what) {
  const std::string msg = absl::StrCat("brand: ", what, ": ", brand_last_error(), " [",
                                       brand_status_name(st), "]");
  switch (st) {
    case BRAND_ERR_INVALID_ARGUMENT:
    case BRAND_ERR_CONFIG:
      return absl::InvalidArgumentError(msg);
    case BRAND_ERR_NOT_FOUND:
      return absl::NotFoundError(msg);
    case BRAND_ERR_IO:
      // Operating-system errors (EIO, permissions, io_uring missing): the
      // data may be fine, the machine could not deliver it.
      return absl::UnavailableError(msg);
    case BRAND_ERR_FORMAT:
    case BRAND_ERR_CORRUPT:
      return absl::DataLossError(msg);
    case BRAND_ERR_INVALID_STATE:
      return absl::InvalidArgumentError(msg);
    case BRAND_ERR_STATE_MISMATCH:
      // A valid checkpoint, but of another dataset or plan config.
      return absl::FailedPreconditionError(msg);
    case BRAND_ERR_BUFFER_TOO_SMALL:
    case BRAND_ERR_CLOSED:
    case BRAND_ERR_PANIC:
      return absl::InternalError(msg);
    default:
      return absl::UnknownError(msg);
  }
}

#define BRAND_RETURN_IF_ERROR(call, what)         \
  do {                                            \
    const int32_t brand_st_ = (call);             \
    if (brand_st_ < 0) return BrandError(brand_st_, what); \
  } while (0)

// Whether this process runs tf.data service servers for brand
// (brand.tf.service sets BRAND_TF_SERVICE=1 before they start).
bool ServiceMode() {
  const char* v = std::getenv("BRAND_TF_SERVICE");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

// The config a loader is opened with: in service mode `nodes = []` first,
// which turns brand's multi-node push off (and the environment's node list
// with it); a config that sets `nodes` too then fails as a duplicate key.
// Prepended, not appended: later keys could sit under a TOML table header.
std::string LoaderConfigText(const std::string& config) {
  return ServiceMode() ? absl::StrCat("nodes = []\n", config) : config;
}

// A brand error from opening with LoaderConfigText(config), explained when
// service mode's own key may be the cause.
absl::Status OpenError(int32_t st, const std::string& what) {
  absl::Status s = BrandError(st, what.c_str());
  if (st == BRAND_ERR_CONFIG && ServiceMode()) {
    s = absl::InvalidArgumentError(absl::StrCat(
        s.message(),
        " (in a tf.data service process (BRAND_TF_SERVICE=1) brand.tf opens every loader with `nodes = []`: "
        "brand's own multi-node push is off, the service moves the data, so the dataset's config must not "
        "set nodes)"));
  }
  return s;
}

// Default splits per epoch: 1 per 256 samples (so each split is several
// chunks' worth, and a GetSplit round trip per split is cheap next to
// serving it), at most 64 (8 per worker for 8 workers); at least 1.
int64_t DefaultSplits(uint64_t samples) {
  const uint64_t s = samples / 256;
  return static_cast<int64_t>(s < 1 ? 1 : (s > 64 ? 64 : s));
}

// The most splits an epoch may be cut into (brand's largest world).
constexpr int64_t kMaxSplits = 1 << 16;

// The samples of split k of S (rank k of a world of S) that are real, not
// the padding that evens out ranks: positions k, k + S, ... below n.
uint64_t SplitSamples(uint64_t n, uint64_t k, uint64_t s) { return n > k ? (n - k + s - 1) / s : 0; }

// Hands out the splits [epoch, k, S] of `epochs` epochs from `first_epoch`
// (no end if epochs < 0), k = 0..S-1 within each. Reset (a new repetition)
// moves on to the next `epochs` epochs. Thread-safe: the dispatcher serves
// GetSplit calls concurrently.
class BrandSplitProvider : public SplitProvider {
 public:
  BrandSplitProvider(int64_t first_epoch, int64_t epochs, int64_t splits)
      : first_epoch_(first_epoch), epochs_(epochs), splits_(splits) {}

  absl::Status GetNext(Tensor* split, bool* end_of_splits) override {
    absl::MutexLock l(&mu_);
    if (epochs_ >= 0 && next_ >= epochs_ * splits_) {
      *end_of_splits = true;
      return absl::OkStatus();
    }
    const int64_t epoch = first_epoch_ + (epochs_ > 0 ? repetition_ * epochs_ : 0) + next_ / splits_;
    Tensor t(DT_INT64, TensorShape({3}));
    auto v = t.flat<int64_t>();
    v(0) = epoch;
    v(1) = next_ % splits_;
    v(2) = splits_;
    next_++;
    *split = std::move(t);
    *end_of_splits = false;
    return absl::OkStatus();
  }

  absl::Status Reset() override {
    absl::MutexLock l(&mu_);
    repetition_++;
    next_ = 0;
    return absl::OkStatus();
  }

  absl::Status Save(std::function<std::string(std::string)> full_name, IteratorStateWriter* writer) override {
    absl::MutexLock l(&mu_);
    TF_RETURN_IF_ERROR(writer->WriteScalar(full_name("repetition"), repetition_));
    return writer->WriteScalar(full_name("next"), next_);
  }

  absl::Status Restore(std::function<std::string(std::string)> full_name, IteratorStateReader* reader) override {
    absl::MutexLock l(&mu_);
    int64_t repetition = 0, next = 0;
    TF_RETURN_IF_ERROR(reader->ReadScalar(full_name("repetition"), &repetition));
    TF_RETURN_IF_ERROR(reader->ReadScalar(full_name("next"), &next));
    if (repetition < 0 || next < 0 || (epochs_ >= 0 && next > epochs_ * splits_)) {
      return absl::DataLossError(absl::StrCat("brand: saved split provider position (repetition ", repetition,
                                              ", split ", next, ") is out of range for ", epochs_,
                                              " epochs of ", splits_, " splits"));
    }
    repetition_ = repetition;
    next_ = next;
    return absl::OkStatus();
  }

  int64_t Cardinality() const override { return epochs_ < 0 ? kInfiniteCardinality : epochs_ * splits_; }

 private:
  const int64_t first_epoch_;
  const int64_t epochs_;
  const int64_t splits_;
  absl::Mutex mu_;
  int64_t repetition_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

// Owns a brand_batch for the scope of one GetNext (batched mode).
struct BatchGuard {
  brand_batch* b = nullptr;
  ~BatchGuard() { brand_batch_free(&b); }
};

class BrandDatasetOp : public DatasetOpKernel {
 public:
  explicit BrandDatasetOp(OpKernelConstruction* ctx) : DatasetOpKernel(ctx) {}

  void MakeDataset(OpKernelContext* ctx, DatasetBase** output) override {
    tstring path, config;
    int64_t epoch = 0, epochs = 0, batch_size = 0, splits = 0;
    OP_REQUIRES_OK(ctx, ParseScalarArgument<tstring>(ctx, "path", &path));
    OP_REQUIRES_OK(ctx, ParseScalarArgument<tstring>(ctx, "config", &config));
    OP_REQUIRES_OK(ctx, ParseScalarArgument<int64_t>(ctx, "epoch", &epoch));
    OP_REQUIRES_OK(ctx, ParseScalarArgument<int64_t>(ctx, "epochs", &epochs));
    OP_REQUIRES_OK(ctx, ParseScalarArgument<int64_t>(ctx, "batch_size", &batch_size));
    OP_REQUIRES_OK(ctx, ParseScalarArgument<int64_t>(ctx, "splits", &splits));
    OP_REQUIRES(ctx, epoch >= 0, absl::InvalidArgumentError("epoch must be >= 0"));
    OP_REQUIRES(ctx, epochs >= -1, absl::InvalidArgumentError("epochs must be >= 0, or -1 for no end"));
    OP_REQUIRES(ctx, batch_size >= 0, absl::InvalidArgumentError("batch_size must be >= 0"));
    OP_REQUIRES(ctx, splits >= 0 && splits <= kMaxSplits,
                absl::InvalidArgumentError(
                    absl::StrCat("splits must be in 1..=", kMaxSplits, " (or 0 for the default), not ", splits)));
    OP_REQUIRES(ctx, epochs <= (int64_t{1} << 40),
                absl::InvalidArgumentError(absl::StrCat("epochs ", epochs, " is past 2^40; use -1 for no end")));
    const Tensor* world_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->input("resume_world", &world_t));
    OP_REQUIRES(ctx, world_t->dims() == 1, absl::InvalidArgumentError("resume_world must be a vector"));
    std::vector<std::string> resume_world;
    const auto world_v = world_t->flat<tstring>();
    for (int64_t i = 0; i < world_v.size(); i++) resume_world.emplace_back(world_v(i));

    // Checked here from metadata only (manifest, index, plan; no loader, no
    // I/O thread, no buffers): a bad path or config fails where the dataset
    // is made, not at the first element, and the epoch length gives a real
    // cardinality.
    uint64_t epoch_len = 0;
    const int32_t st = brand_epoch_len_for(path.c_str(), LoaderConfigText(config).c_str(), &epoch_len);
    OP_REQUIRES(ctx, st >= 0, OpenError(st, absl::StrCat("opening ", std::string(path))));

    *output = new Dataset(ctx, std::string(path), std::string(config), epoch, epochs, batch_size,
                          static_cast<int64_t>(epoch_len), std::move(resume_world), splits);
  }

 private:
  class Dataset : public DatasetBase {
   public:
    Dataset(OpKernelContext* ctx, std::string path, std::string config, int64_t epoch, int64_t epochs,
            int64_t batch_size, int64_t epoch_len, std::vector<std::string> resume_world, int64_t splits)
        : DatasetBase(DatasetContext(ctx)),
          path_(std::move(path)),
          config_(std::move(config)),
          epoch_(epoch),
          epochs_(epochs),
          batch_size_(batch_size),
          epoch_len_(epoch_len),
          resume_world_(std::move(resume_world)),
          splits_(splits),
          dtypes_({DT_STRING, DT_INT64, DT_STRING, DT_INT64}),
          shapes_(4, batch_size > 0 ? PartialTensorShape({-1}) : PartialTensorShape({})) {}

    std::unique_ptr<IteratorBase> MakeIteratorInternal(const std::string& prefix) const override {
      return std::make_unique<Iterator>(Iterator::Params{this, absl::StrCat(prefix, "::", kDatasetType)});
    }

    const DataTypeVector& output_dtypes() const override { return dtypes_; }
    const std::vector<PartialTensorShape>& output_shapes() const override { return shapes_; }

    std::string DebugString() const override { return "BrandDatasetOp::Dataset"; }

    // Elements per epoch: samples, or batches. brand's batches are full
    // except the last of each epoch (they never span epochs), hence ceil.
    int64_t PerEpoch() const {
      return batch_size_ > 0 ? (epoch_len_ + batch_size_ - 1) / batch_size_ : epoch_len_;
    }

    int64_t CardinalityInternal(CardinalityOptions) const override {
      if (epochs_ < 0) return PerEpoch() == 0 ? 0 : kInfiniteCardinality;
      return epochs_ * PerEpoch();
    }

    absl::Status InputDatasets(std::vector<const DatasetBase*>*) const override { return absl::OkStatus(); }

    // The elements are a function of the dataset files and the config alone.
    absl::Status CheckExternalState() const override { return absl::OkStatus(); }

    // tf.data service's dynamic sharding (runs in the dispatcher): one
    // provider of the epochs' splits (see the top of this file).
    absl::Status MakeSplitProviders(std::vector<std::unique_ptr<SplitProvider>>* split_providers) const override {
      if (!resume_world_.empty()) {
        return absl::InvalidArgumentError(
            "brand: a BrandDataset with resume_world cannot be split for tf.data service's dynamic sharding "
            "(the splits are whole epochs' ranks; resume_world continues another world's epoch)");
      }
      // As split 0 of 1: checks that the config opens as a split, and its
      // length is the dataset's sample count.
      uint64_t samples = 0;
      const int32_t st = brand_epoch_len_for(path_.c_str(), SplitConfig(0, 1).c_str(), &samples);
      if (st < 0) return SplitOpenError(st, absl::StrCat("making the splits of ", path_));
      const int64_t splits = splits_ > 0 ? splits_ : DefaultSplits(samples);
      split_providers->clear();
      split_providers->push_back(std::make_unique<BrandSplitProvider>(epoch_, epochs_, splits));
      return absl::OkStatus();
    }

    // Split k of `splits`: rank k of that world, brand's multi-node push
    // off. Keys first: the config may end inside a TOML table.
    std::string SplitConfig(int64_t k, int64_t splits) const {
      return absl::StrCat("nodes = []\nrank = ", k, "\nworld = ", splits, "\n", config_);
    }

    static absl::Status SplitOpenError(int32_t st, const std::string& what) {
      absl::Status s = BrandError(st, what.c_str());
      if (st != BRAND_ERR_CONFIG) return s;
      return absl::InvalidArgumentError(absl::StrCat(
          s.message(),
          " (under tf.data service's dynamic sharding each split is opened as rank k of a world of S splits with "
          "brand's multi-node push off (`nodes = []`), so the dataset's config must not set rank, world or nodes)"));
    }

   protected:
    absl::Status AsGraphDefInternal(SerializationContext*, DatasetGraphDefBuilder* b,
                                    Node** output) const override {
      Node *path, *config, *epoch, *epochs, *batch_size, *resume_world;
      TF_RETURN_IF_ERROR(b->AddScalar(tstring(path_), &path));
      TF_RETURN_IF_ERROR(b->AddScalar(tstring(config_), &config));
      TF_RETURN_IF_ERROR(b->AddScalar(epoch_, &epoch));
      TF_RETURN_IF_ERROR(b->AddScalar(epochs_, &epochs));
      TF_RETURN_IF_ERROR(b->AddScalar(batch_size_, &batch_size));
      TF_RETURN_IF_ERROR(b->AddVector(resume_world_, &resume_world));
      Node* splits;
      TF_RETURN_IF_ERROR(b->AddScalar(splits_, &splits));
      return b->AddDataset(this, {path, config, epoch, epochs, batch_size, resume_world, splits}, output);
    }

   private:
    class Iterator : public DatasetIterator<Dataset> {
     public:
      explicit Iterator(const Params& p) : DatasetIterator<Dataset>(p) {}
      ~Iterator() override {
        if (deregister_cancellation_) deregister_cancellation_();
        absl::MutexLock l(&mu_);
        Reset();
      }

      // A cancelled pipeline (iterator deleted mid-prefetch, a step
      // cancelled) closes the loader at once instead of waiting for the next
      // GetNext: its I/O thread and buffers go, and a call blocked in
      // brand_next returns when its own read completes or times out
      // (io_timeout); every later GetNext is Cancelled.
      absl::Status Initialize(IteratorContext* ctx) override {
        // tf.data service's dynamic sharding gives the worker's pipeline a
        // split provider (a GetSplit call to the dispatcher per split).
        const std::vector<std::shared_ptr<SplitProvider>> providers = ctx->split_providers();
        if (providers.size() > 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("brand: BrandDataset is one source and takes one split provider, not ", providers.size()));
        }
        if (!providers.empty()) {
          absl::MutexLock l(&mu_);
          split_provider_ = providers[0];
        }
        return RegisterCancellationCallback(
            ctx->cancellation_manager(), [this]() { Cancel(); }, &deregister_cancellation_);
      }

      // The state is a position (a brand state blob and an index), never
      // data; an iterator over splits has none (SaveInternal).
      bool SymbolicCheckpointCompatible() const override {
        absl::MutexLock l(&mu_);
        return split_provider_ == nullptr;
      }

      absl::Status GetNextInternal(IteratorContext* ctx, std::vector<Tensor>* out,
                                   bool* end_of_sequence) override {
        absl::MutexLock l(&mu_);
        if (cancelled_.load()) return Cancelled();
        if (split_provider_ != nullptr) return GetNextFromSplits(ctx, out, end_of_sequence);
        // Opened lazily: an iterator that is restored right away opens once.
        if (!done_ && loader_ == nullptr) TF_RETURN_IF_ERROR(OpenFresh());
        if (done_) {
          *end_of_sequence = true;
          return absl::OkStatus();
        }
        if (dataset()->batch_size_ > 0) {
          BatchGuard g;
          TF_RETURN_IF_ERROR(NextBatch(&g.b));
          if (g.b == nullptr) {
            *end_of_sequence = true;
            return absl::OkStatus();
          }
          const size_t n = brand_batch_len(g.b);
          if (static_cast<int64_t>(n) > dataset()->batch_size_) {
            // Cardinality and shapes assume the config's batch_size matches.
            return absl::InternalError(absl::StrCat("brand returned a batch of ", n,
                                                    " samples; the dataset was made for batch_size ",
                                                    dataset()->batch_size_));
          }
          return Emit(ctx, g.b, 0, n, /*vector=*/true, out, end_of_sequence);
        }
        if (batch_ == nullptr || pos_ >= len_) {
          brand_batch_free(&batch_);
          // The state before this batch: a checkpoint taken while it is
          // being emitted is (that state, pos_).
          TF_RETURN_IF_ERROR(SaveState(&state_before_));
          TF_RETURN_IF_ERROR(NextBatch(&batch_));
          if (batch_ == nullptr) {
            *end_of_sequence = true;
            return absl::OkStatus();
          }
          pos_ = 0;
          len_ = brand_batch_len(batch_);
        }
        return Emit(ctx, batch_, pos_++, 1, /*vector=*/false, out, end_of_sequence);
      }

     protected:
      std::shared_ptr<model::Node> CreateNode(IteratorContext*, model::Node::Args args) const override {
        return model::MakeSourceNode(std::move(args));
      }

      // Cheap (no I/O, no data): under symbolic checkpointing TF calls this
      // after every element.
      absl::Status SaveInternal(SerializationContext*, IteratorStateWriter* writer) override {
        absl::MutexLock l(&mu_);
        if (split_provider_ != nullptr) return SplitsNotCheckpointed();
        TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kDone, done_ ? 1 : 0));
        if (done_) return absl::OkStatus();
        std::string state;
        int64_t pos = 0;
        if (batch_ != nullptr && pos_ < len_) {
          size_t most = 0;
          BRAND_RETURN_IF_ERROR(brand_state_size(loader_, &most), "brand_state_size");
          if (most > BRAND_POSITION_STATE_SIZE) {
            // A job attached to a cache (or resumed from one's state): its
            // batch cannot be read again, so the state is the position
            // inside it, with the rest of the batch not served.
            TF_RETURN_IF_ERROR(SaveState(&state, served_before_ + pos_));
          } else {
            state = state_before_;
            pos = static_cast<int64_t>(pos_);
          }
        } else if (loader_ != nullptr) {
          TF_RETURN_IF_ERROR(SaveState(&state));
        }
        // No state: nothing was read yet; a restore starts afresh.
        if (!state.empty()) {
          TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kState, tstring(state)));
          TF_RETURN_IF_ERROR(writer->WriteScalar(prefix(), kPos, pos));
        }
        return absl::OkStatus();
      }

      absl::Status RestoreInternal(IteratorContext*, IteratorStateReader* reader) override {
        absl::MutexLock l(&mu_);
        if (split_provider_ != nullptr) return SplitsNotCheckpointed();
        Reset();
        int64_t done = 0;
        TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kDone, &done));
        if (done) {
          done_ = true;
          return absl::OkStatus();
        }
        if (!reader->Contains(prefix(), kState)) return OpenFresh();
        tstring state;
        int64_t pos = 0;
        TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kState, &state));
        TF_RETURN_IF_ERROR(reader->ReadScalar(prefix(), kPos, &pos));
        const Dataset* d = dataset();
        brand_loader* opened = nullptr;
        const int32_t st = brand_open_at(d->path_.c_str(), LoaderConfigText(d->config_).c_str(),
                                         reinterpret_cast<const uint8_t*>(state.data()), state.size(), &opened);
        if (st < 0) return OpenError(st, "restoring the iterator from its checkpoint");
        SetLoader(opened);
        TF_RETURN_IF_ERROR(SetLastEpoch(LastEpoch()));
        // Mid-batch (per-sample mode): re-read the batch and skip what was
        // already emitted. Skipping across batches keeps this right even if
        // the restored config reads with another batch size. (An attached
        // job saves its position inside the batch instead, pos 0: its
        // batches depend on timing, so the batch read again is another one.)
        if (pos > 0 && state.size() > BRAND_POSITION_STATE_SIZE) {
          return absl::DataLossError(absl::StrCat(
              "brand: this checkpoint holds an attached job's state and a position ", pos,
              " inside its batch, which cannot be read again"));
        }
        while (pos > 0) {
          TF_RETURN_IF_ERROR(SaveState(&state_before_));
          TF_RETURN_IF_ERROR(NextBatch(&batch_));
          if (batch_ == nullptr) return absl::DataLossError("brand: checkpoint position is past the end of the data");
          len_ = brand_batch_len(batch_);
          if (static_cast<size_t>(pos) < len_) {
            pos_ = static_cast<size_t>(pos);
            break;
          }
          pos -= static_cast<int64_t>(len_);
          brand_batch_free(&batch_);
        }
        return absl::OkStatus();
      }

     private:
      absl::Status OpenFresh() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const Dataset* d = dataset();
        if (d->epochs_ == 0 || d->epoch_len_ == 0) {
          done_ = true;  // nothing to emit (and no endless loop over empty epochs)
          return absl::OkStatus();
        }
        brand_loader* opened = nullptr;
        if (!d->resume_world_.empty()) {
          // Elastic: where the saved world stopped, as this rank of this world.
          std::vector<const uint8_t*> states;
          std::vector<size_t> lens;
          for (const std::string& s : d->resume_world_) {
            states.push_back(reinterpret_cast<const uint8_t*>(s.data()));
            lens.push_back(s.size());
          }
          const int32_t st = brand_open_at_elastic(d->path_.c_str(), LoaderConfigText(d->config_).c_str(),
                                                   states.data(), lens.data(), states.size(), &opened);
          if (st < 0) return OpenError(st, "resuming from the saved world's states (resume_world)");
          SetLoader(opened);
          return SetLastEpoch(LastEpoch());
        }
        const int32_t st = brand_open(d->path_.c_str(), LoaderConfigText(d->config_).c_str(), &opened);
        if (st < 0) return OpenError(st, "opening the dataset");
        SetLoader(opened);
        if (d->epoch_ > 0) {
          BRAND_RETURN_IF_ERROR(brand_start_epoch(loader_, static_cast<uint64_t>(d->epoch_)), "brand_start_epoch");
        }
        return SetLastEpoch(LastEpoch());
      }

      // GetNext over the splits the split provider hands out: each split's
      // real samples (its rank's share of its epoch, no padding), then the
      // next split, until the provider has no more.
      absl::Status GetNextFromSplits(IteratorContext* ctx, std::vector<Tensor>* out, bool* end_of_sequence)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (;;) {
          if (done_) {
            *end_of_sequence = true;
            return absl::OkStatus();
          }
          if (loader_ == nullptr) {
            TF_RETURN_IF_ERROR(OpenNextSplit());
            continue;
          }
          if (dataset()->batch_size_ > 0) {
            BatchGuard g;
            TF_RETURN_IF_ERROR(NextSplitBatch(&g.b));
            if (g.b == nullptr) continue;  // the split is over
            const size_t n = std::min<uint64_t>(brand_batch_len(g.b), split_left_);
            split_left_ -= n;
            if (static_cast<int64_t>(n) > dataset()->batch_size_) {
              return absl::InternalError(absl::StrCat("brand returned a batch of ", n,
                                                      " samples; the dataset was made for batch_size ",
                                                      dataset()->batch_size_));
            }
            return Emit(ctx, g.b, 0, n, /*vector=*/true, out, end_of_sequence);
          }
          if (batch_ == nullptr || pos_ >= len_) {
            brand_batch_free(&batch_);
            TF_RETURN_IF_ERROR(NextSplitBatch(&batch_));
            if (batch_ == nullptr) continue;
            pos_ = 0;
            len_ = std::min<uint64_t>(brand_batch_len(batch_), split_left_);
            split_left_ -= len_;
          }
          return Emit(ctx, batch_, pos_++, 1, /*vector=*/false, out, end_of_sequence);
        }
      }

      // Asks the split provider for the next split and opens it; at the end
      // of the splits the iterator is done. Holds mu_ through the GetSplit
      // round trip: GetNext calls are serial anyway, and Cancel takes no lock.
      absl::Status OpenNextSplit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        Tensor split;
        bool end_of_splits = false;
        TF_RETURN_IF_ERROR(split_provider_->GetNext(&split, &end_of_splits));
        if (cancelled_.load()) return Cancelled();
        if (end_of_splits) {
          done_ = true;
          return absl::OkStatus();
        }
        if (split.dtype() != DT_INT64 || split.NumElements() != 3) {
          return absl::InvalidArgumentError(absl::StrCat(
              "brand: a BrandDataset split is an int64 vector [epoch, index, splits], not ", split.DebugString()));
        }
        const auto v = split.flat<int64_t>();
        const int64_t epoch = v(0), k = v(1), splits = v(2);
        if (epoch < 0 || splits < 1 || splits > kMaxSplits || k < 0 || k >= splits) {
          return absl::InvalidArgumentError(absl::StrCat("brand: split [", epoch, ", ", k, ", ", splits,
                                                         "] is out of range (epoch >= 0, 0 <= index < splits <= ",
                                                         kMaxSplits, ")"));
        }
        const Dataset* d = dataset();
        brand_loader* opened = nullptr;
        const std::string what = absl::StrCat("opening split ", k, " of ", splits, " of epoch ", epoch);
        const int32_t st = brand_open(d->path_.c_str(), d->SplitConfig(k, splits).c_str(), &opened);
        if (st < 0) return Dataset::SplitOpenError(st, what);
        SetLoader(opened);
        if (loader_ == nullptr) return Cancelled();
        uint64_t samples = 0;
        BRAND_RETURN_IF_ERROR(brand_dataset_samples(loader_, &samples), "brand_dataset_samples");
        split_left_ = SplitSamples(samples, static_cast<uint64_t>(k), static_cast<uint64_t>(splits));
        if (split_left_ == 0) {
          SetLoader(nullptr);  // nothing of its own in this split (more splits than samples)
          return absl::OkStatus();
        }
        if (epoch > 0) {
          BRAND_RETURN_IF_ERROR(brand_start_epoch(loader_, static_cast<uint64_t>(epoch)), "brand_start_epoch");
        }
        return SetLastEpoch(epoch);
      }

      // The next batch of the open split; NULL (and the loader closed) once
      // its real samples are all handed out, or at its epoch's end (drop_last).
      absl::Status NextSplitBatch(brand_batch** b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        *b = nullptr;
        if (split_left_ > 0) {
          const int32_t st = brand_next(loader_, b);
          if (cancelled_.load()) {
            brand_batch_free(b);
            return Cancelled();
          }
          if (st == BRAND_OK) return absl::OkStatus();
          if (st != BRAND_END_OF_EPOCH) return BrandError(st, "reading the next batch of a split");
        }
        split_left_ = 0;
        SetLoader(nullptr);  // frees its I/O thread and buffers now
        return absl::OkStatus();
      }

      static absl::Status SplitsNotCheckpointed() {
        return absl::UnimplementedError(
            "brand: an iterator over tf.data service splits (distributed_epoch / ShardingPolicy.DYNAMIC) is not "
            "checkpointed: the service hands each split out at most once and does not restore its workers' "
            "iterators; checkpoint the trainer's step instead, or use ShardingPolicy.OFF with rank/world");
      }

      // The next batch, moving on across epoch ends until the last epoch
      // asked for is over; then *b stays NULL and the iterator is done.
      absl::Status NextBatch(brand_batch** b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const Dataset* d = dataset();
        for (;;) {
          BRAND_RETURN_IF_ERROR(brand_tell(loader_, &epoch_before_, &served_before_), "brand_tell");
          const int32_t st = brand_next(loader_, b);
          if (cancelled_.load()) {
            brand_batch_free(b);
            return Cancelled();
          }
          if (st == BRAND_OK) return absl::OkStatus();
          if (st != BRAND_END_OF_EPOCH) return BrandError(st, "reading the next batch");
          uint64_t epoch = 0;
          BRAND_RETURN_IF_ERROR(brand_tell(loader_, &epoch, nullptr), "brand_tell");
          if (d->epochs_ >= 0 && epoch >= static_cast<uint64_t>(d->epoch_ + d->epochs_)) {
            done_ = true;
            SetLoader(nullptr);  // frees its I/O thread and buffers now
            return absl::OkStatus();
          }
          // The next brand_next starts epoch `epoch`.
        }
      }

      // The loader's state now, or with `served` at that many samples of the
      // epoch of the batch in hand (a position inside it).
      absl::Status SaveState(std::string* out, std::optional<uint64_t> served = std::nullopt)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        size_t need = 0;
        BRAND_RETURN_IF_ERROR(brand_state_size(loader_, &need), "brand_state_size");
        out->resize(need);
        size_t written = 0;
        uint8_t* buf = reinterpret_cast<uint8_t*>(out->data());
        if (served.has_value()) {
          BRAND_RETURN_IF_ERROR(brand_state_save_at(loader_, epoch_before_, *served, buf, need, &written),
                                "brand_state_save_at");
        } else {
          BRAND_RETURN_IF_ERROR(brand_state_save(loader_, buf, need, &written), "brand_state_save");
        }
        out->resize(written);
        return absl::OkStatus();
      }

      // Copies samples [first, first + n) of `b` into the four outputs:
      // vectors of n, or scalars (n == 1). Strings cannot borrow brand's
      // memory (tstring views are shallow-copied downstream and would
      // outlive the batch), so data and key are copied once, here.
      absl::Status Emit(IteratorContext* ctx, const brand_batch* b, size_t first, size_t n, bool vector,
                        std::vector<Tensor>* out, bool* end_of_sequence) {
        const TensorShape shape = vector ? TensorShape({static_cast<int64_t>(n)}) : TensorShape({});
        Tensor data(ctx->allocator({}), DT_STRING, shape);
        Tensor id(ctx->allocator({}), DT_INT64, shape);
        Tensor key(ctx->allocator({}), DT_STRING, shape);
        Tensor label(ctx->allocator({}), DT_INT64, shape);
        auto data_v = data.flat<tstring>();
        auto id_v = id.flat<int64_t>();
        auto key_v = key.flat<tstring>();
        auto label_v = label.flat<int64_t>();
        for (size_t i = 0; i < n; i++) {
          brand_sample s;
          BRAND_RETURN_IF_ERROR(brand_batch_sample(b, first + i, &s), "brand_batch_sample");
          data_v(i).assign(reinterpret_cast<const char*>(s.data), s.len);
          key_v(i).assign(s.key, s.key_len);
          id_v(i) = static_cast<int64_t>(s.id);
          label_v(i) = s.label;
        }
        out->reserve(4);
        out->push_back(std::move(data));
        out->push_back(std::move(id));
        out->push_back(std::move(key));
        out->push_back(std::move(label));
        *end_of_sequence = false;
        return absl::OkStatus();
      }

      // The last epoch this iterator emits, or -1 for no end.
      int64_t LastEpoch() const {
        const Dataset* d = dataset();
        return d->epochs_ <= 0 ? -1 : d->epoch_ + d->epochs_ - 1;
      }

      // No read-ahead past `last` (< 0: none). A loader reads the next epoch
      // ahead otherwise: up to `readahead` bytes (GETs, on a store) nothing
      // here takes; a split's loader, opened for one epoch's split, did it
      // for every split.
      absl::Status SetLastEpoch(int64_t last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (loader_ == nullptr || last < 0) return absl::OkStatus();
        BRAND_RETURN_IF_ERROR(brand_set_last_epoch(loader_, last), "brand_set_last_epoch");
        return absl::OkStatus();
      }

      // Replaces the open loader (closing the old one) and publishes the
      // handle to Cancel, which runs without mu_.
      void SetLoader(brand_loader* l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        live_.store(l);
        // A handle Cancel already closed gives BRAND_ERR_CLOSED here: fine.
        brand_close(&loader_);
        loader_ = l;
        if (cancelled_.load()) {
          // Cancelled while this loader was being opened.
          live_.store(nullptr);
          brand_close(&loader_);
        }
      }

      // Cancellation callback: may run on any thread while GetNext holds mu_
      // and waits in brand_next, so it takes no lock. Handles are ids that
      // are never reused, so closing a copy is safe even if the iterator
      // closes or replaces the loader at the same time.
      void Cancel() {
        cancelled_.store(true);
        brand_loader* h = live_.exchange(nullptr);
        brand_close(&h);
      }

      static absl::Status Cancelled() { return absl::CancelledError("brand: the iterator was cancelled"); }

      void Reset() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        brand_batch_free(&batch_);
        live_.store(nullptr);
        brand_close(&loader_);
        state_before_.clear();
        pos_ = len_ = 0;
        split_left_ = 0;
        done_ = false;
      }

      mutable absl::Mutex mu_;
      brand_loader* loader_ ABSL_GUARDED_BY(mu_) = nullptr;
      // Cancellation: a copy of loader_ for Cancel, and whether it ran.
      std::atomic<brand_loader*> live_{nullptr};
      std::atomic<bool> cancelled_{false};
      std::function<void()> deregister_cancellation_;
      // tf.data service's dynamic sharding: the provider of splits, and the
      // real samples of the open split not yet taken from the loader.
      std::shared_ptr<SplitProvider> split_provider_ ABSL_GUARDED_BY(mu_);
      uint64_t split_left_ ABSL_GUARDED_BY(mu_) = 0;
      // Per-sample mode: the batch being emitted, the next index in it, and
      // the loader state from just before it was read.
      brand_batch* batch_ ABSL_GUARDED_BY(mu_) = nullptr;
      size_t pos_ ABSL_GUARDED_BY(mu_) = 0;
      size_t len_ ABSL_GUARDED_BY(mu_) = 0;
      std::string state_before_ ABSL_GUARDED_BY(mu_);
      // Where the loader was before the brand_next that returned batch_.
      uint64_t epoch_before_ ABSL_GUARDED_BY(mu_) = 0;
      uint64_t served_before_ ABSL_GUARDED_BY(mu_) = 0;
      bool done_ ABSL_GUARDED_BY(mu_) = false;
    };

    const std::string path_;
    const std::string config_;
    const int64_t epoch_;
    const int64_t epochs_;
    const int64_t batch_size_;
    const int64_t epoch_len_;
    const std::vector<std::string> resume_world_;
    const int64_t splits_;
    const DataTypeVector dtypes_;
    const std::vector<PartialTensorShape> shapes_;
  };
};

REGISTER_OP("BrandDataset")
    .Input("path: string")
    .Input("config: string")
    .Input("epoch: int64")
    .Input("epochs: int64")
    .Input("batch_size: int64")
    .Input("resume_world: string")
    .Input("splits: int64")
    .Output("handle: variant")
    // Stateful, as TF's own source datasets: no constant folding or CSE of
    // two readers into one.
    .SetDoNotOptimize()
    .SetShapeFn(shape_inference::ScalarShape);

REGISTER_KERNEL_BUILDER(Name("BrandDataset").Device(DEVICE_CPU), BrandDatasetOp);

// The BrandDataset iterators' positions in a saved iterator state: for each
// one, the brand state blob (empty if it had read nothing), the index into the
// batch being emitted (per-sample mode) and whether it was done. Reads TF's
// layout of an iterator state: one VariantTensorData per iterator prefix,
// whose metadata is "prefix@@key1@@key2..." naming its tensors in order
// (tensorflow/core/data/serialization_utils).
class BrandSavedStateOp : public OpKernel {
 public:
  explicit BrandSavedStateOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& in = ctx->input(0);
    std::vector<std::string> states;
    std::vector<int64_t> positions, done;
    const std::string suffix = absl::StrCat("::", kDatasetType);
    for (int64_t i = 0; i < in.NumElements(); i++) {
      const auto* saved = in.flat<Variant>()(i).get<IteratorStateVariant>();
      OP_REQUIRES(ctx, saved != nullptr,
                  absl::InvalidArgumentError(absl::StrCat("element ", i, " is not a saved iterator state")));
      const VariantTensorData* data = saved->GetData();
      if (data == nullptr) continue;
      std::string metadata;
      data->get_metadata(&metadata);
      const std::vector<std::string> keys = absl::StrSplit(metadata, "@@", absl::SkipEmpty());
      if (keys.empty() || !absl::EndsWith(keys[0], suffix)) continue;
      std::string state;
      int64_t pos = 0, is_done = 0;
      for (size_t k = 1; k < keys.size(); k++) {
        OP_REQUIRES(ctx, k - 1 < static_cast<size_t>(data->tensors_size()),
                    absl::DataLossError(absl::StrCat("saved iterator ", keys[0], ": key ", keys[k], " has no tensor")));
        const Tensor& t = data->tensors(k - 1);
        if (keys[k] == kState && t.dtype() == DT_STRING && t.NumElements() == 1) state = t.flat<tstring>()(0);
        if (keys[k] == kPos && t.dtype() == DT_INT64 && t.NumElements() == 1) pos = t.flat<int64_t>()(0);
        if (keys[k] == kDone && t.dtype() == DT_INT64 && t.NumElements() == 1) is_done = t.flat<int64_t>()(0);
      }
      states.push_back(std::move(state));
      positions.push_back(pos);
      done.push_back(is_done);
    }
    const int64_t n = static_cast<int64_t>(states.size());
    Tensor *states_t, *positions_t, *done_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &states_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &positions_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({n}), &done_t));
    for (int64_t i = 0; i < n; i++) {
      states_t->flat<tstring>()(i) = states[i];
      positions_t->flat<int64_t>()(i) = positions[i];
      done_t->flat<int64_t>()(i) = done[i];
    }
  }
};

REGISTER_OP("BrandSavedState")
    .Input("state: variant")
    .Output("states: string")
    .Output("positions: int64")
    .Output("done: int64")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < 3; i++) c->set_output(i, c->Vector(shape_inference::InferenceContext::kUnknownDim));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("BrandSavedState").Device(DEVICE_CPU), BrandSavedStateOp);

}  // namespace
}  // namespace data
}  // namespace tensorflow
