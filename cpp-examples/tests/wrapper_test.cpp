// wrapper_test: brand.hpp's guarantees. usage: wrapper_test DATASET SAMPLES
#include "brand.hpp"

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

static int failures = 0;
#define EXPECT(cond)                                                            \
    do {                                                                        \
        if (!(cond)) {                                                          \
            failures++;                                                         \
            std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
        }                                                                       \
    } while (0)

template <class F>
static brand_status status_of(F f) {
    try {
        f();
    } catch (const brand::Error &e) {
        std::fprintf(stderr, "  (expected) %s\n", e.what());
        return e.status();
    }
    return BRAND_OK;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: wrapper_test DATASET SAMPLES\n");
        return 2;
    }
    const std::string ds = argv[1];
    const uint64_t n = std::strtoull(argv[2], nullptr, 10);
    const std::string cfg = "batch_size = 10\nmemory = \"32 slots\"\nread_gap = \"whole\"";

    // Errors carry the status and the library's message.
    EXPECT(status_of([&] { brand::Loader::open(ds + "-missing"); }) == BRAND_ERR_NOT_FOUND);
    EXPECT(status_of([&] { brand::Loader::open(ds, "batch_size = 0"); }) == BRAND_ERR_CONFIG);
    EXPECT(status_of([&] { brand::Loader::open_at(ds, cfg, {1, 2, 3}); }) == BRAND_ERR_INVALID_STATE);
    try {
        brand::Loader::open(ds, "policy = \"lru\"");
        EXPECT(false);
    } catch (const brand::Error &e) {
        EXPECT(std::string(e.what()).find("lru") != std::string::npos);
        EXPECT(std::string(e.what()).find("BRAND_ERR_CONFIG") != std::string::npos);
    }

    // An epoch through the wrapper: every sample once, aligned; batches freed by scope.
    brand::Loader a = brand::Loader::open(ds, cfg);
    EXPECT(a.dataset_samples() == n && a.epoch_len() == n);
    std::set<uint64_t> seen;
    uint64_t served = 0;
    while (auto batch = a.next()) {
        EXPECT(batch->epoch() == 0);
        for (const brand::Sample &s : *batch) {
            EXPECT(reinterpret_cast<uintptr_t>(s.data) % BRAND_SAMPLE_ALIGN == 0);
            EXPECT(!s.key.empty());
            seen.insert(s.id);
            served++;
        }
        std::vector<brand_sample> bulk;
        batch->samples(bulk);
        EXPECT(bulk.size() == batch->size() && bulk.back().id == (*batch)[batch->size() - 1].id);
        if (seen.size() == batch->size()) {  // the first batch: an index out of range throws
            EXPECT(status_of([&] { (*batch)[batch->size()]; }) == BRAND_ERR_INVALID_ARGUMENT);
        }
    }
    EXPECT(served == n && seen.size() == n);
    EXPECT(a.tell().epoch == 1 && a.tell().served == 0);

    // Moving a Loader moves ownership: the moved-from one is empty and errors.
    brand::Loader b = std::move(a);
    EXPECT(a.get() == nullptr);
    EXPECT(status_of([&] { a.next(); }) == BRAND_ERR_INVALID_ARGUMENT);
    auto first = b.next();
    EXPECT(first.has_value() && first->epoch() == 1);
    // A Batch outlives its Loader; moving it keeps one owner.
    {
        brand::Loader c = std::move(b);
    }
    brand::Batch kept = std::move(*first);
    EXPECT(first->get() == nullptr && first->size() == 0);
    EXPECT(kept.size() == 10 && kept[0].data != nullptr);

    // save_state / open_at round trip through the wrapper.
    brand::Loader d = brand::Loader::open(ds, cfg);
    d.next();
    d.next();
    const std::vector<uint8_t> state = d.save_state();
    auto after = d.next();
    brand::Loader e = brand::Loader::open_at(ds, cfg, state);
    EXPECT(e.tell().served == 20);
    auto resumed = e.next();
    EXPECT(after && resumed && (*after)[0].id == (*resumed)[0].id);
    EXPECT(status_of([&] { brand::Loader::open_at(ds, "seed = 9\nmemory = \"32 slots\"", state); }) ==
           BRAND_ERR_STATE_MISMATCH);
    EXPECT(e.metrics().samples_served == 10);

    if (failures) {
        std::fprintf(stderr, "wrapper_test: %d failures\n", failures);
        return 1;
    }
    std::printf("wrapper_test: ok\n");
    return 0;
}
