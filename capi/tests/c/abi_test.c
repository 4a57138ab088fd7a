/*
 * abi_test: brand.h exercised from C (and, compiled with g++ -x c++, from
 * C++), linked statically and dynamically, run plainly, under valgrind and
 * with ASan+UBSan (see the root Makefile's capi-test target).
 *
 * usage: abi_test DATASET SOURCE_DIR SAMPLES
 *   DATASET     a dataset packed by `brand pack SOURCE_DIR -o DATASET --chunk-size 16`
 *   SOURCE_DIR  the ImageFolder it was packed from (`brand gen`): every
 *               sample's bytes are compared with the file its key names.
 *   SAMPLES     the number of samples in it
 *
 * Exits 0 when every check passed, 1 otherwise (each failure is printed).
 */
#include "brand.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
static int checks = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        checks++;                                                          \
        if (!(cond)) {                                                     \
            failures++;                                                    \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, " [last error: %s]\n", brand_last_error());    \
        }                                                                  \
    } while (0)

#define CHECK_STATUS(call, want)                                           \
    do {                                                                   \
        brand_status got_ = (call);                                        \
        CHECK(got_ == (want), "%s returned %s, want %s", #call,            \
              brand_status_name(got_), brand_status_name(want));           \
    } while (0)

static const char *CONFIG =
    "batch_size = 16\n"
    "memory = \"32 slots\"\n"
    "read_gap = \"0\"\n"
    "queue_depth = 8\n"
    "seed = 3\n";

static const char *dataset;
static const char *source_dir;

/* The bytes of SOURCE_DIR/key, or NULL; *len set. Caller frees. */
static uint8_t *read_source(const char *key, size_t key_len, size_t *len) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%.*s", source_dir, (int)key_len, key);
    if (n < 0 || (size_t)n >= sizeof path) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = (uint8_t *)malloc(size > 0 ? (size_t)size : 1);
    size_t got = buf ? fread(buf, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)size) {
        free(buf);
        return NULL;
    }
    *len = got;
    return buf;
}

static brand_loader *open_or_die(const char *config) {
    brand_loader *l = NULL;
    brand_status st = brand_open(dataset, config, &l);
    if (st != BRAND_OK || !l) {
        fprintf(stderr, "brand_open(%s): %s: %s\n", dataset, brand_status_name(st), brand_last_error());
        exit(1);
    }
    return l;
}

/*
 * Reads batches until the end of the epoch (or max_batches), appending the
 * served ids to order[*count]. Checks every sample: alignment, bytes equal
 * the source file, label, and that it belongs to `epoch`. Returns 1 if the
 * epoch ended.
 */
static int read_epoch(brand_loader *l, uint64_t epoch, uint64_t *order, size_t *count, size_t cap,
                      size_t max_batches, int compare_bytes) {
    for (size_t nb = 0; nb < max_batches; nb++) {
        brand_batch *b = (brand_batch *)&failures; /* must be overwritten */
        brand_status st = brand_next(l, &b);
        if (st == BRAND_END_OF_EPOCH) {
            CHECK(b == NULL, "END_OF_EPOCH leaves *out NULL");
            CHECK(strcmp(brand_last_error(), "") == 0, "no message after a success");
            return 1;
        }
        CHECK(st == BRAND_OK, "brand_next: %s", brand_status_name(st));
        if (st != BRAND_OK) return 0;
        size_t n = brand_batch_len(b);
        CHECK(n >= 1 && n <= 16, "batch of %zu", n);
        CHECK(brand_batch_epoch(b) == epoch, "batch epoch %" PRIu64 ", want %" PRIu64, brand_batch_epoch(b), epoch);
        for (size_t i = 0; i < n; i++) {
            brand_sample s;
            memset(&s, 0, sizeof s);
            CHECK_STATUS(brand_batch_sample(b, i, &s), BRAND_OK);
            CHECK(s.data != NULL && ((uintptr_t)s.data % BRAND_SAMPLE_ALIGN) == 0, "sample %" PRIu64 " aligned", s.id);
            CHECK(s.key != NULL && s.key_len > 0, "sample %" PRIu64 " has a key", s.id);
            CHECK(s.label >= 0 && s.label < 5, "label %" PRId64, s.label);
            if (*count < cap) order[(*count)++] = s.id;
            if (compare_bytes) {
                size_t len = 0;
                uint8_t *want = read_source(s.key, s.key_len, &len);
                CHECK(want != NULL, "source file of %.*s", (int)s.key_len, s.key);
                if (want) {
                    CHECK(len == s.len && memcmp(want, s.data, len) == 0, "bytes of sample %" PRIu64 " (%.*s)",
                          s.id, (int)s.key_len, s.key);
                    /* Label = the class directory's index in sorted order. */
                    char cls[32];
                    snprintf(cls, sizeof cls, "class-%04" PRId64 "/", s.label);
                    CHECK(s.key_len > strlen(cls) && memcmp(s.key, cls, strlen(cls)) == 0, "label %" PRId64
                          " matches key %.*s", s.label, (int)s.key_len, s.key);
                }
                free(want);
            }
        }
        brand_sample past;
        CHECK_STATUS(brand_batch_sample(b, n, &past), BRAND_ERR_INVALID_ARGUMENT);
        /* The bulk accessor gives the same samples in one call. */
        brand_sample *all = (brand_sample *)calloc(n, sizeof(brand_sample));
        CHECK_STATUS(brand_batch_samples(b, 0, n, all), BRAND_OK);
        for (size_t i = 0; all && i < n; i++) {
            brand_sample one;
            CHECK_STATUS(brand_batch_sample(b, i, &one), BRAND_OK);
            CHECK(all[i].data == one.data && all[i].len == one.len && all[i].id == one.id && all[i].key == one.key &&
                      all[i].key_len == one.key_len && all[i].label == one.label,
                  "bulk sample %zu", i);
        }
        CHECK_STATUS(brand_batch_samples(b, 1, n, all), BRAND_ERR_INVALID_ARGUMENT);
        free(all);
        brand_batch_free(&b);
        CHECK(b == NULL, "brand_batch_free NULLs the variable");
        brand_batch_free(&b); /* the second free through the variable is a no-op */
    }
    return 0;
}

/* Sorted copy check: ids[0..n] is a permutation of 0..n. */
static int is_permutation(const uint64_t *ids, size_t n) {
    unsigned char *seen = (unsigned char *)calloc(n ? n : 1, 1);
    int ok = seen != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        if (ids[i] >= n || seen[ids[i]]) ok = 0;
        else seen[ids[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_versions_and_errors(void) {
    CHECK(brand_abi_version() == BRAND_ABI_VERSION, "abi %u vs header %d", brand_abi_version(), BRAND_ABI_VERSION);
    CHECK(strncmp(brand_version(), "brand ", 6) == 0, "version %s", brand_version());
    CHECK(brand_last_error() != NULL && brand_last_error()[0] == '\0', "no message before any call");
    CHECK(strcmp(brand_status_name(BRAND_ERR_CORRUPT), "BRAND_ERR_CORRUPT") == 0, "status name");
    CHECK(strcmp(brand_status_name(-999), "BRAND_UNKNOWN_STATUS") == 0, "unknown status name");
    CHECK(sizeof(brand_status) == 4, "brand_status is 32 bits");

    brand_loader *l = (brand_loader *)&checks;
    CHECK_STATUS(brand_open(NULL, NULL, &l), BRAND_ERR_INVALID_ARGUMENT);
    CHECK(l == NULL, "*out NULL on failure");
    CHECK(strstr(brand_last_error(), "dataset_path is NULL") != NULL, "message names the argument");
    CHECK_STATUS(brand_open(dataset, NULL, NULL), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_open("/nonexistent/brand-dataset", NULL, &l), BRAND_ERR_NOT_FOUND);
    CHECK(strstr(brand_last_error(), "/nonexistent/brand-dataset") != NULL, "message names the path");
    CHECK_STATUS(brand_open(dataset, "batch_size = 0", &l), BRAND_ERR_CONFIG);
    CHECK(strstr(brand_last_error(), "batch_size") != NULL, "message names the key");
    CHECK_STATUS(brand_open(dataset, "bogus = [", &l), BRAND_ERR_CONFIG);
    CHECK(l == NULL, "*out NULL on failure");
    CHECK_STATUS(brand_open_at(dataset, NULL, NULL, 0, &l), BRAND_ERR_INVALID_ARGUMENT);

    brand_batch *b = NULL;
    CHECK_STATUS(brand_next(NULL, &b), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_start_epoch(NULL, 0), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_set_last_epoch(NULL, 0), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_tell(NULL, NULL, NULL), BRAND_ERR_INVALID_ARGUMENT);
    uint64_t u = 0;
    CHECK_STATUS(brand_epoch_len(NULL, &u), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_dataset_samples(NULL, &u), BRAND_ERR_INVALID_ARGUMENT);
    size_t z = 0;
    CHECK_STATUS(brand_state_size(NULL, &z), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_state_save(NULL, NULL, 0, &z), BRAND_ERR_INVALID_ARGUMENT);
    brand_metrics m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    CHECK_STATUS(brand_get_metrics(NULL, &m), BRAND_ERR_INVALID_ARGUMENT);
    brand_sample s;
    CHECK_STATUS(brand_batch_sample(NULL, 0, &s), BRAND_ERR_INVALID_ARGUMENT);
    CHECK(brand_batch_len(NULL) == 0 && brand_batch_epoch(NULL) == 0, "NULL batch accessors");
    brand_batch_free(NULL);
    brand_batch_free(&b);
    CHECK_STATUS(brand_close(NULL), BRAND_OK);
    l = NULL;
    CHECK_STATUS(brand_close(&l), BRAND_OK);

    /* brand.h: a config that is not UTF-8 is BRAND_ERR_INVALID_ARGUMENT. */
    CHECK_STATUS(brand_open(dataset, "seed = 1 # \xff", &l), BRAND_ERR_INVALID_ARGUMENT);
    CHECK(l == NULL, "*out NULL on failure");
    /* Absurd batch sizes are a config error, never an abort. */
    CHECK_STATUS(brand_open(dataset, "batch_size = 4611686018427387904", &l), BRAND_ERR_CONFIG);
    CHECK_STATUS(brand_open(dataset, "batch_size = 18446744073709551615", &l), BRAND_ERR_CONFIG);
    CHECK(l == NULL, "*out NULL on failure");

    /* The epoch length from metadata only, errors as brand_open. */
    u = 7;
    CHECK_STATUS(brand_epoch_len_for(NULL, NULL, &u), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_epoch_len_for(dataset, NULL, NULL), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_epoch_len_for("/nonexistent/brand-dataset", NULL, &u), BRAND_ERR_NOT_FOUND);
    CHECK_STATUS(brand_epoch_len_for(dataset, "world = 2\nrank = 2", &u), BRAND_ERR_CONFIG);
    CHECK(u == 7, "*out untouched on failure");
}

static void test_epochs(size_t n) {
    brand_loader *l = open_or_die(CONFIG);
    uint64_t samples = 0, len = 0;
    CHECK_STATUS(brand_dataset_samples(l, &samples), BRAND_OK);
    CHECK_STATUS(brand_epoch_len(l, &len), BRAND_OK);
    CHECK(samples == n && len == n, "samples %" PRIu64 ", epoch length %" PRIu64 ", want %zu", samples, len, n);
    uint64_t len_for = 0;
    CHECK_STATUS(brand_epoch_len_for(dataset, CONFIG, &len_for), BRAND_OK);
    CHECK(len_for == len, "brand_epoch_len_for %" PRIu64 ", brand_epoch_len %" PRIu64, len_for, len);

    uint64_t *e0 = (uint64_t *)calloc(n + 1, sizeof(uint64_t));
    uint64_t *e1 = (uint64_t *)calloc(n + 1, sizeof(uint64_t));
    size_t c0 = 0, c1 = 0;
    CHECK(read_epoch(l, 0, e0, &c0, n + 1, (size_t)-1, 1), "epoch 0 ends");
    CHECK(c0 == n && is_permutation(e0, c0), "epoch 0: every sample exactly once (%zu served)", c0);
    uint64_t epoch = 9, served = 9;
    CHECK_STATUS(brand_tell(l, &epoch, &served), BRAND_OK);
    CHECK(epoch == 1 && served == 0, "after the end: epoch %" PRIu64 " served %" PRIu64, epoch, served);
    CHECK(read_epoch(l, 1, e1, &c1, n + 1, (size_t)-1, 0), "epoch 1 ends");
    CHECK(c1 == n && is_permutation(e1, c1), "epoch 1: every sample exactly once");
    CHECK(memcmp(e0, e1, n * sizeof(uint64_t)) != 0, "epochs have their own order");

    brand_metrics m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    CHECK_STATUS(brand_get_metrics(l, &m), BRAND_OK);
    CHECK(m.struct_size == sizeof m, "metrics filled whole");
    CHECK(m.samples_served == 2 * n, "samples_served %" PRIu64, m.samples_served);
    CHECK(m.bytes_read >= m.bytes_served && m.bytes_served > 0 && m.reads_issued > 0, "byte counters");
    CHECK(m.read_gap == 0, "read gap %" PRIu64, m.read_gap);
    /* A dataset in object storage reports its GETs; a directory none. */
    if (strncmp(dataset, "s3://", 5) == 0) {
        CHECK(m.store_requests > 0 && m.store_bytes_fetched >= m.bytes_read / 2 && m.store_gets_in_flight_limit > 0,
              "store metrics: %" PRIu64 " requests, %" PRIu64 " bytes", m.store_requests, m.store_bytes_fetched);
    } else {
        CHECK(m.store_requests == 0 && m.store_bytes_fetched == 0, "no store metrics for a directory");
    }
    /* An older caller whose struct ends before samples_served. */
    unsigned char raw[sizeof(brand_metrics) + 8];
    memset(raw, 0xAB, sizeof raw);
    uint32_t old = (uint32_t)offsetof(brand_metrics, samples_served);
    memcpy(raw, &old, sizeof old);
    CHECK_STATUS(brand_get_metrics(l, (brand_metrics *)(void *)raw), BRAND_OK);
    int untouched = 1;
    for (size_t i = old; i < sizeof raw; i++) untouched &= raw[i] == 0xAB;
    CHECK(untouched, "nothing written past the caller's struct_size");

    /* Resume mid-epoch 0 with another batch size: the same sequence. */
    CHECK_STATUS(brand_start_epoch(l, 0), BRAND_OK);
    CHECK_STATUS(brand_set_last_epoch(l, -1), BRAND_OK);
    uint64_t *part = (uint64_t *)calloc(n + 1, sizeof(uint64_t));
    size_t cp = 0;
    CHECK(!read_epoch(l, 0, part, &cp, n + 1, 3, 0), "three batches");
    size_t size = 0, written = 0;
    CHECK_STATUS(brand_state_size(l, &size), BRAND_OK);
    uint8_t small[4];
    CHECK_STATUS(brand_state_save(l, small, sizeof small, &written), BRAND_ERR_BUFFER_TOO_SMALL);
    CHECK(written == size, "written %zu = needed %zu", written, size);
    uint8_t *blob = (uint8_t *)malloc(size);
    CHECK_STATUS(brand_state_save(l, blob, size, &written), BRAND_OK);
    brand_loader *stale = l;
    CHECK_STATUS(brand_close(&l), BRAND_OK);
    CHECK(l == NULL, "brand_close NULLs the variable");
    brand_batch *b = NULL;
    CHECK_STATUS(brand_next(l, &b), BRAND_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(brand_next(stale, &b), BRAND_ERR_CLOSED);
    CHECK(b == NULL, "no batch from a closed loader");
    CHECK_STATUS(brand_close(&stale), BRAND_ERR_CLOSED);

    brand_loader *r = NULL;
    CHECK_STATUS(brand_open_at(dataset, "seed = 4\nmemory = \"32 slots\"", blob, size, &r), BRAND_ERR_STATE_MISMATCH);
    CHECK(r == NULL && strstr(brand_last_error(), "seed 3 in the state, 4 now") != NULL, "mismatch named");
    blob[20] ^= 1;
    CHECK_STATUS(brand_open_at(dataset, CONFIG, blob, size, &r), BRAND_ERR_INVALID_STATE);
    blob[20] ^= 1;
    CHECK_STATUS(brand_open_at(dataset, "batch_size = 7\nmemory = \"32 slots\"\nread_gap = \"whole\"\nseed = 3",
                               blob, size, &r),
                 BRAND_OK);
    if (r) {
        CHECK(read_epoch(r, 0, part, &cp, n + 1, (size_t)-1, 0), "resumed epoch ends");
        CHECK(cp == n && memcmp(part, e0, n * sizeof(uint64_t)) == 0, "resumed = uninterrupted (%zu)", cp);
        /* A batch outlives its loader. */
        CHECK_STATUS(brand_next(r, &b), BRAND_OK);
        brand_sample before, after;
        CHECK_STATUS(brand_batch_sample(b, 0, &before), BRAND_OK);
        CHECK_STATUS(brand_close(&r), BRAND_OK);
        CHECK_STATUS(brand_batch_sample(b, 0, &after), BRAND_OK);
        CHECK(after.data == before.data && after.id == before.id, "batch valid after close");
        volatile uint64_t sum = 0;
        for (size_t i = 0; i < after.len; i++) sum += after.data[i];
        (void)sum;
        brand_batch_free(&b);
    }

    free(blob);
    free(part);
    free(e0);
    free(e1);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DATASET SOURCE_DIR SAMPLES\n", argv[0]);
        return 2;
    }
    dataset = argv[1];
    source_dir = argv[2];
    size_t n = (size_t)strtoull(argv[3], NULL, 10);
    test_versions_and_errors();
    test_epochs(n);
    if (failures) {
        fprintf(stderr, "abi_test: %d of %d checks FAILED\n", failures, checks);
        return 1;
    }
    printf("abi_test: %d checks passed (%s, ABI %u)\n", checks, brand_version(), brand_abi_version());
    return 0;
}
