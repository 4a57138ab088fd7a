// brand_throughput: reads a dataset through the C ABI and reports samples/s
// and MB/s per epoch, then the engine's metrics (read amplification, stalls,
// peak resident memory). For benchmarking drives (NVMe, Optane) and for
// measuring the ABI's own cost against `brand read` (bench/capi_vs_rust.sh).
//
//   brand_throughput DATASET [--config TOML] [--epochs N] [--touch none|first|all] [--per-sample] [--json]
//
// Samples are taken with one brand_batch_samples call per batch, or with
// --per-sample one brand_batch_sample call each.
// --touch says what is done with each sample: none takes its pointer and
// length only (what `brand read` does: the interface's cost alone), first
// (the default) also reads its first byte (one cache miss per sample when
// the data is not in cache), all sums every byte (a consumer that reads its data).
#include "brand.hpp"

#include <time.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void usage(const char *why) {
    std::cerr << "brand_throughput: " << why << "\n"
              << "usage: brand_throughput DATASET [--config TOML] [--epochs N] [--touch none|first|all] [--per-sample] [--json]\n";
    std::exit(2);
}

/// CPU seconds used by this thread (not counting time preempted by other work).
double thread_cpu_secs() {
    timespec ts{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0.0;
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char **argv) {
    std::string dataset, config, touch = "first";
    uint64_t epochs = 1;
    bool json = false, per_sample = false;
    for (int i = 1; i < argc; i++) {
        std::string k = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value for " + k).c_str());
            return argv[++i];
        };
        if (k == "--config") config = value();
        else if (k == "--epochs") {
            try {
                epochs = std::stoull(value());
            } catch (const std::logic_error &) {
                usage("bad --epochs");
            }
        } else if (k == "--touch") touch = value();
        else if (k == "--json") json = true;
        else if (k == "--per-sample") per_sample = true;
        else if (!k.empty() && k[0] == '-') usage(("unknown option " + k).c_str());
        else dataset = k;
    }
    if (dataset.empty()) usage("no dataset");
    if (touch != "none" && touch != "first" && touch != "all") usage("--touch is none, first or all");
    const bool all = touch == "all", first = touch == "first";

    try {
        brand::Loader loader = brand::Loader::open(dataset, config);
        if (json) std::printf("{\"epochs\": [");
        else std::printf("%5s %10s %8s %12s %10s\n", "epoch", "samples", "secs", "samples/s", "MB/s");
        volatile uint64_t sink = 0;
        for (uint64_t e = 0; e < epochs; e++) {
            uint64_t samples = 0, bytes = 0, acc = 0;
            const auto start = std::chrono::steady_clock::now();
            const double cpu = thread_cpu_secs();
            std::vector<brand_sample> taken;
            while (std::optional<brand::Batch> batch = loader.next()) {
                const size_t n = batch->size();
                taken.resize(n);
                if (per_sample) {
                    for (size_t i = 0; i < n; i++) {
                        brand::check(brand_batch_sample(batch->get(), i, &taken[i]), "brand_batch_sample");
                    }
                } else {
                    brand::check(brand_batch_samples(batch->get(), 0, n, taken.data()), "brand_batch_samples");
                }
                for (const brand_sample &s : taken) {
                    bytes += s.len;
                    if (all) {
                        for (size_t j = 0; j < s.len; j++) acc += s.data[j];
                    } else if (first && s.len > 0) {
                        acc += s.data[0];
                    } else {
                        acc ^= reinterpret_cast<uintptr_t>(s.data);
                    }
                }
                samples += n;
            }
            const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            const double cpu_secs = thread_cpu_secs() - cpu;
            sink = sink + acc;
            if (json) {
                std::printf("%s{\"epoch\": %" PRIu64 ", \"samples\": %" PRIu64 ", \"seconds\": %.6f, "
                            "\"cpu_seconds\": %.6f, \"samples_per_sec\": %.1f, \"mb_per_sec\": %.2f}",
                            e ? ", " : "", e, samples, secs, cpu_secs, samples / secs, bytes / secs / 1e6);
            } else {
                std::printf("%5" PRIu64 " %10" PRIu64 " %8.3f %12.0f %10.1f\n", e, samples, secs, samples / secs,
                            bytes / secs / 1e6);
            }
        }
        const brand_metrics m = loader.metrics();
        const char *gap_unit = m.read_gap == BRAND_READ_GAP_WHOLE ? "whole chunks" : "bytes";
        const uint64_t gap = m.read_gap == BRAND_READ_GAP_WHOLE ? 0 : m.read_gap;
        if (json) {
            std::printf("], \"metrics\": {\"bytes_read\": %" PRIu64 ", \"bytes_served\": %" PRIu64
                        ", \"read_amplification\": %.4f, \"reads_issued\": %" PRIu64 ", \"stalls\": %" PRIu64
                        ", \"stall_p50_secs\": %.6f, \"stall_p99_secs\": %.6f, \"stall_max_secs\": %.6f"
                        ", \"peak_resident_bytes\": %" PRIu64 ", \"buffered_fallback\": %u}}\n",
                        m.bytes_read, m.bytes_served, m.read_amplification, m.reads_issued, m.stalls,
                        m.stall_p50_secs, m.stall_p99_secs, m.stall_max_secs, m.peak_resident_bytes,
                        m.buffered_fallback);
        } else {
            std::printf("read %.1f MB for %.1f MB served: read amplification %.2f, %" PRIu64 " reads, read gap %" PRIu64
                        " %s%s\n",
                        m.bytes_read / 1e6, m.bytes_served / 1e6, m.read_amplification, m.reads_issued, gap, gap_unit,
                        m.buffered_fallback ? " (buffered I/O: O_DIRECT refused)" : "");
            std::printf("stalls %" PRIu64 " (%.3f s): p50 %.3f ms, p95 %.3f ms, p99 %.3f ms, max %.3f ms\n", m.stalls,
                        m.stall_secs_total, m.stall_p50_secs * 1e3, m.stall_p95_secs * 1e3, m.stall_p99_secs * 1e3,
                        m.stall_max_secs * 1e3);
            std::printf("peak resident %.1f MiB in %" PRIu64 " samples\n", m.peak_resident_bytes / 1048576.0,
                        m.peak_resident_samples);
        }
        return 0;
    } catch (const std::exception &e) {
        std::cerr << "brand_throughput: " << e.what() << "\n";
        return 1;
    }
}
