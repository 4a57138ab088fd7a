// train_loop: the shape of a C++ training binary on brand.
//
//   train_loop DATASET [--config TOML] [--epochs E] [--checkpoint FILE] [--every K]
//              [--resume FILE] [--log FILE] [--step-ms MS]
//
// Runs epochs until the loader reaches epoch E, "training" on each batch (a
// checksum over its bytes stands in for a step, plus an optional sleep),
// and every K batches saves the loader state to FILE atomically (write
// FILE.tmp, fsync, rename). Started with --resume FILE it continues exactly
// where that checkpoint was taken; a missing FILE means a fresh start, so
// the same command line can be rerun after a crash.
//
// --log FILE appends one line per event, flushed after every batch (so a
// SIGKILL loses nothing already consumed):
//   R <epoch> <served>   started (resumed) at this position
//   S <epoch> <id>       a sample consumed by a training step
//   C <epoch> <served>   a checkpoint of this position is being written
//   E <epoch>            an epoch ended
// The C line is written before the rename: the checkpoint on disk always has
// its C line in the log (the last C line may be newer than the file if the
// process died between the two).
#include "brand.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Args {
    std::string dataset;
    std::string config;
    uint64_t epochs = 1;
    std::string checkpoint;
    uint64_t every = 0;
    std::string resume;
    std::string log;
    int step_ms = 0;
};

[[noreturn]] void usage(const char *why) {
    std::cerr << "train_loop: " << why << "\n"
              << "usage: train_loop DATASET [--config TOML] [--epochs E] [--checkpoint FILE] [--every K]\n"
              << "                  [--resume FILE] [--log FILE] [--step-ms MS]\n";
    std::exit(2);
}

Args parse(int argc, char **argv) {
    Args a;
    for (int i = 1; i < argc; i++) {
        std::string k = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value for " + k).c_str());
            return argv[++i];
        };
        try {
            if (k == "--config") a.config = value();
            else if (k == "--epochs") a.epochs = std::stoull(value());
            else if (k == "--checkpoint") a.checkpoint = value();
            else if (k == "--every") a.every = std::stoull(value());
            else if (k == "--resume") a.resume = value();
            else if (k == "--log") a.log = value();
            else if (k == "--step-ms") a.step_ms = std::stoi(value());
            else if (!k.empty() && k[0] == '-') usage(("unknown option " + k).c_str());
            else if (a.dataset.empty()) a.dataset = k;
            else usage("more than one dataset");
        } catch (const std::logic_error &) {
            usage(("bad number for " + k).c_str());
        }
    }
    if (a.dataset.empty()) usage("no dataset");
    if (a.every > 0 && a.checkpoint.empty()) usage("--every needs --checkpoint");
    return a;
}

bool read_file(const std::string &path, std::vector<uint8_t> &out) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return true;
}

/// Writes `data` to `path` atomically: a reader (or a restart) sees the old
/// file or the new one, never a torn one.
void write_atomically(const std::string &path, const std::vector<uint8_t> &data) {
    const std::string tmp = path + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
    size_t done = 0;
    while (done < data.size()) {
        ssize_t n = ::write(fd, data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ::close(fd);
            throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
        }
        done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) throw std::runtime_error("cannot sync " + tmp);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
    }
}

/// The stand-in for a training step: a checksum over every byte.
uint64_t consume(const brand::Sample &s) {
    uint64_t h = 0xcbf29ce484222325ull ^ s.id;
    for (size_t i = 0; i < s.size; i++) h = (h ^ s.data[i]) * 0x100000001b3ull;
    return h;
}

}  // namespace

int main(int argc, char **argv) {
    const Args a = parse(argc, argv);
    try {
        FILE *log = nullptr;
        if (!a.log.empty()) {
            log = std::fopen(a.log.c_str(), "a");
            if (!log) throw std::runtime_error("cannot open log " + a.log + ": " + std::strerror(errno));
        }
        std::vector<uint8_t> state;
        const bool resumed = !a.resume.empty() && read_file(a.resume, state);
        brand::Loader loader =
            resumed ? brand::Loader::open_at(a.dataset, a.config, state) : brand::Loader::open(a.dataset, a.config);
        brand::Position at = loader.tell();
        std::printf("train_loop: %s at epoch %" PRIu64 ", %" PRIu64 " of %" PRIu64 " samples served\n",
                    resumed ? "resumed" : "started", at.epoch, at.served, loader.epoch_len());
        if (log) {
            std::fprintf(log, "R %" PRIu64 " %" PRIu64 "\n", at.epoch, at.served);
            std::fflush(log);
        }

        auto checkpoint = [&]() {
            const brand::Position p = loader.tell();
            if (log) {
                std::fprintf(log, "C %" PRIu64 " %" PRIu64 "\n", p.epoch, p.served);
                std::fflush(log);
            }
            write_atomically(a.checkpoint, loader.save_state());
        };
        uint64_t checksum = 0, batches = 0, samples = 0;
        while (loader.tell().epoch < a.epochs) {
            std::optional<brand::Batch> batch = loader.next();
            if (!batch) {
                uint64_t ended = loader.tell().epoch - 1;
                std::printf("train_loop: epoch %" PRIu64 " done\n", ended);
                if (log) {
                    std::fprintf(log, "E %" PRIu64 "\n", ended);
                    std::fflush(log);
                }
                continue;
            }
            for (const brand::Sample &s : *batch) {
                checksum += consume(s);
                if (log) std::fprintf(log, "S %" PRIu64 " %" PRIu64 "\n", batch->epoch(), s.id);
            }
            samples += batch->size();
            if (log) std::fflush(log);
            if (a.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
            batches++;
            if (a.every > 0 && batches % a.every == 0) checkpoint();
        }
        if (!a.checkpoint.empty()) checkpoint();
        if (log) std::fclose(log);
        std::printf("train_loop: %" PRIu64 " samples in %" PRIu64 " batches, checksum %016" PRIx64 "\n", samples,
                    batches, checksum);
        return 0;
    } catch (const brand::Error &e) {
        std::cerr << "train_loop: " << e.what() << "\n";
        return 1;
    } catch (const std::exception &e) {
        std::cerr << "train_loop: " << e.what() << "\n";
        return 1;
    }
}
