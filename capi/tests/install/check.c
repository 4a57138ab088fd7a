/*
 * check: the installed brand package as a C program sees it, built by
 * run.sh with pkg-config (shared, and static with --static) and by
 * CMakeLists.txt with find_package(brand) (brand::brand, brand::brand_static).
 *
 * usage: check DATASET SAMPLES
 * Prints "brand X.Y.Z abi N" (run.sh compares it with Cargo.toml and
 * brand.h), then reads one epoch of DATASET and checks it served SAMPLES
 * samples. Exits 0 when every check passed, 1 otherwise.
 */
#include <brand.h>

#include <stdio.h>
#include <stdlib.h>

static int fail(const char *what, brand_status st) {
    fprintf(stderr, "check: %s: %s: %s\n", what, brand_status_name(st), brand_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: check DATASET SAMPLES\n");
        return 2;
    }
    uint32_t abi = brand_abi_version();
    if (abi != BRAND_ABI_VERSION) {
        fprintf(stderr, "check: brand.h has ABI %u, the library %u\n", (unsigned)BRAND_ABI_VERSION, (unsigned)abi);
        return 1;
    }
    printf("%s abi %u\n", brand_version(), (unsigned)abi);

    brand_loader *l = NULL;
    brand_status st = brand_open("/nonexistent/brand-install-check", NULL, &l);
    if (st != BRAND_ERR_NOT_FOUND || l != NULL)
        return fail("brand_open on a missing path is not BRAND_ERR_NOT_FOUND", st);

    st = brand_open(argv[1], "batch_size = 16\nmemory = \"32 slots\"\n", &l);
    if (st != BRAND_OK)
        return fail(argv[1], st);
    size_t served = 0;
    brand_batch *b = NULL;
    while ((st = brand_next(l, &b)) == BRAND_OK) {
        served += brand_batch_len(b);
        brand_batch_free(&b);
    }
    brand_close(&l);
    if (st != BRAND_END_OF_EPOCH)
        return fail("brand_next", st);
    size_t want = (size_t)strtoull(argv[2], NULL, 10);
    if (served != want) {
        fprintf(stderr, "check: one epoch served %zu samples, not %zu\n", served, want);
        return 1;
    }
    printf("one epoch: %zu samples\n", served);
    return 0;
}
