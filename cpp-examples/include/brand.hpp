// brand.hpp: a small C++17 RAII wrapper over brand.h (the C ABI).
//
//   brand::Loader loader = brand::Loader::open("/data/imagenet.brand", "batch_size = 256\nmemory = \"10%\"");
//   while (auto batch = loader.next()) {          // std::nullopt at the end of an epoch
//       for (const brand::Sample& s : *batch) train_on(s.data, s.size, s.label);
//   }                                             // the batch is freed when it goes out of scope
//   std::vector<uint8_t> state = loader.save_state();   // later: Loader::open_at(path, config, state)
//
// Ownership: Loader owns its brand_loader (closed by the destructor, move-only);
// Batch owns its brand_batch (freed by the destructor, move-only) and Samples
// borrow from it: their pointers are valid while the Batch lives.
// Errors: every failing call throws brand::Error, which carries the
// brand_status and brand_last_error()'s message.
#pragma once

#include <brand.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace brand {

/// A failed brand call: status() is the brand_status, what() says what and why.
class Error : public std::runtime_error {
  public:
    Error(brand_status status, const std::string &message) : std::runtime_error(message), status_(status) {}
    brand_status status() const noexcept { return status_; }

  private:
    brand_status status_;
};

/// Throws brand::Error for an error status (negative); returns the status otherwise.
inline brand_status check(brand_status status, const char *call) {
    if (status < 0) {
        throw Error(status, std::string(call) + ": " + brand_status_name(status) + ": " + brand_last_error());
    }
    return status;
}

/// One sample, borrowed from its Batch.
struct Sample {
    const uint8_t *data;  ///< BRAND_SAMPLE_ALIGN-aligned
    size_t size;
    std::string_view key;  ///< raw bytes, not NUL-terminated
    uint64_t id;
    int64_t label;
};

/// A batch of samples; frees itself.
class Batch {
  public:
    explicit Batch(brand_batch *b) noexcept : b_(b) {}
    Batch(Batch &&o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
    Batch &operator=(Batch &&o) noexcept {
        if (this != &o) {
            brand_batch_free(&b_);
            b_ = std::exchange(o.b_, nullptr);
        }
        return *this;
    }
    Batch(const Batch &) = delete;
    Batch &operator=(const Batch &) = delete;
    ~Batch() { brand_batch_free(&b_); }

    size_t size() const noexcept { return brand_batch_len(b_); }
    uint64_t epoch() const noexcept { return brand_batch_epoch(b_); }

    Sample operator[](size_t i) const {
        brand_sample s;
        check(brand_batch_sample(b_, i, &s), "brand_batch_sample");
        return Sample{s.data, s.len, std::string_view(s.key, s.key_len), s.id, s.label};
    }

    /// Every sample of the batch into `out` with one C call (brand_batch_samples): the fast path.
    void samples(std::vector<brand_sample> &out) const {
        out.resize(size());
        check(brand_batch_samples(b_, 0, out.size(), out.data()), "brand_batch_samples");
    }

    class iterator {
      public:
        iterator(const Batch *b, size_t i) : b_(b), i_(i) {}
        Sample operator*() const { return (*b_)[i_]; }
        iterator &operator++() {
            ++i_;
            return *this;
        }
        bool operator!=(const iterator &o) const { return i_ != o.i_; }

      private:
        const Batch *b_;
        size_t i_;
    };
    iterator begin() const { return iterator(this, 0); }
    iterator end() const { return iterator(this, size()); }

    brand_batch *get() const noexcept { return b_; }

  private:
    brand_batch *b_;
};

/// Where a loader is: the epoch and the samples of it already handed out.
struct Position {
    uint64_t epoch;
    uint64_t served;
};

/// An open loader; closes itself.
class Loader {
  public:
    /// Opens `dataset` at the start of epoch 0; `config_toml` as `brand read --config` ("" = defaults).
    static Loader open(const std::string &dataset, const std::string &config_toml = "") {
        check_abi();
        brand_loader *l = nullptr;
        check(brand_open(dataset.c_str(), config_toml.c_str(), &l), "brand_open");
        return Loader(l);
    }

    /// Continues where the loader that saved `state` stopped.
    static Loader open_at(const std::string &dataset, const std::string &config_toml,
                          const std::vector<uint8_t> &state) {
        check_abi();
        brand_loader *l = nullptr;
        check(brand_open_at(dataset.c_str(), config_toml.c_str(), state.data(), state.size(), &l), "brand_open_at");
        return Loader(l);
    }

    /// The next batch, or std::nullopt at the end of the epoch (the next call starts the next one).
    std::optional<Batch> next() {
        brand_batch *b = nullptr;
        if (check(brand_next(get(), &b), "brand_next") == BRAND_END_OF_EPOCH) return std::nullopt;
        return Batch(b);
    }

    void start_epoch(uint64_t epoch) { check(brand_start_epoch(get(), epoch), "brand_start_epoch"); }

    // No read-ahead past the end of `epoch` (< 0: none; see brand_set_last_epoch).
    void set_last_epoch(int64_t epoch) { check(brand_set_last_epoch(get(), epoch), "brand_set_last_epoch"); }

    Position tell() const {
        Position p{0, 0};
        check(brand_tell(get(), &p.epoch, &p.served), "brand_tell");
        return p;
    }

    uint64_t epoch_len() const {
        uint64_t n = 0;
        check(brand_epoch_len(get(), &n), "brand_epoch_len");
        return n;
    }

    uint64_t dataset_samples() const {
        uint64_t n = 0;
        check(brand_dataset_samples(get(), &n), "brand_dataset_samples");
        return n;
    }

    /// The checkpoint blob for open_at (position after the last batch returned).
    std::vector<uint8_t> save_state() const {
        size_t size = 0, written = 0;
        check(brand_state_size(get(), &size), "brand_state_size");
        std::vector<uint8_t> buf(size);
        check(brand_state_save(get(), buf.data(), buf.size(), &written), "brand_state_save");
        buf.resize(written);
        return buf;
    }

    brand_metrics metrics() const {
        brand_metrics m{};
        m.struct_size = sizeof m;
        check(brand_get_metrics(get(), &m), "brand_get_metrics");
        return m;
    }

    brand_loader *get() const noexcept { return l_.get(); }

  private:
    struct Closer {
        void operator()(brand_loader *l) const noexcept { brand_close(&l); }
    };

    explicit Loader(brand_loader *l) : l_(l) {}

    static void check_abi() {
        if (brand_abi_version() != BRAND_ABI_VERSION) {
            throw Error(BRAND_ERR_INVALID_ARGUMENT, "brand.h is ABI " + std::to_string(BRAND_ABI_VERSION) +
                                                        " but the library is ABI " +
                                                        std::to_string(brand_abi_version()));
        }
    }

    std::unique_ptr<brand_loader, Closer> l_;
};

}  // namespace brand
