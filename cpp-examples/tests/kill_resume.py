#!/usr/bin/env python3
"""train_loop survives a SIGKILL: run it with checkpoints, kill it mid-epoch
after a checkpoint, rerun it with --resume, and check from its logs that the
samples consumed up to the checkpointed position plus those consumed after
the resume are exactly the uninterrupted run's sequence: each epoch every
sample once, nothing lost, nothing repeated. (Samples consumed after the last
checkpoint but before the kill are consumed again after the resume: that is
at-least-once between checkpoints, and the test checks they are replayed in
the same order.)

usage: kill_resume.py TRAIN_LOOP DATASET SAMPLES WORKDIR
"""

import os
import shutil
import signal
import struct
import subprocess
import sys
import time

CONFIG = 'batch_size = 16\nmemory = "32 slots"\nread_gap = "0"\nseed = 4\n'
EPOCHS = 2
EVERY = 3  # batches between checkpoints


def parse(log_path):
    with open(log_path) as f:
        return [line.split() for line in f if line.strip()]


def samples(lines):
    return [(int(l[1]), int(l[2])) for l in lines if l[0] == "S"]


def run(train_loop, dataset, workdir, name, step_ms, extra=()):
    log = os.path.join(workdir, name + ".log")
    ckpt = os.path.join(workdir, name + ".ckpt")
    cmd = [train_loop, dataset, "--config", CONFIG, "--epochs", str(EPOCHS), "--log", log,
           "--checkpoint", ckpt, "--every", str(EVERY), "--resume", ckpt, "--step-ms", str(step_ms), *extra]
    return cmd, log, ckpt


def fail(msg):
    print("kill_resume: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    train_loop, dataset, n, workdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)

    # The reference: an uninterrupted run.
    cmd, ref_log, _ = run(train_loop, dataset, workdir, "ref", 0)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    reference = samples(parse(ref_log))
    for e in range(EPOCHS):
        ids = sorted(i for (ep, i) in reference if ep == e)
        if ids != list(range(n)):
            fail(f"uninterrupted run: epoch {e} is not every sample once")

    # The run to kill: slow steps so the kill lands mid-epoch 1, after a
    # checkpoint inside that epoch and after at least one more batch.
    cmd, log, ckpt = run(train_loop, dataset, workdir, "killed", 15)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            fail("train_loop finished before it could be killed mid-epoch (machine too fast or too slow?)")
        if time.monotonic() > deadline:
            proc.kill()
            fail("no checkpoint in epoch 1 within 60 s")
        lines = parse(log) if os.path.exists(log) else []
        cps = [i for i, l in enumerate(lines) if l[0] == "C" and l[1] == "1" and int(l[2]) > 0]
        if cps and any(l[0] == "S" for l in lines[cps[-1] + 1:]):
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.returncode != -signal.SIGKILL:
        fail(f"train_loop exited with {proc.returncode}, not by SIGKILL")
    before = parse(log)

    # The checkpoint on disk (format: capi/src/state.rs) says where to cut.
    with open(ckpt, "rb") as f:
        blob = f.read()
    if blob[:8] != b"BRDSTATE":
        fail("the checkpoint is not a brand state")
    epoch, served = struct.unpack_from("<QQ", blob, 16)
    if epoch != 1 or served == 0:
        fail(f"checkpoint at epoch {epoch}, served {served}: not mid-epoch 1")
    cut = max(i for i, l in enumerate(before) if l[0] == "C" and (int(l[1]), int(l[2])) == (epoch, served))
    kept, lost = samples(before[:cut]), samples(before[cut:])
    if not lost:
        fail("nothing was consumed after the last checkpoint: the test did not test replay")

    # Resume with the same command line (its --resume names the checkpoint).
    os.rename(log, log + ".before")
    subprocess.run(cmd[:-2] + ["--step-ms", "0"], check=True, stdout=subprocess.DEVNULL)
    after_lines = parse(log)
    if after_lines[0] != ["R", str(epoch), str(served)]:
        fail(f"resumed at {after_lines[0]}, want R {epoch} {served}")
    after = samples(after_lines)

    if sum(1 for (e, _) in kept if e == 1) != served:
        fail(f"the log has {sum(1 for (e, _) in kept if e == 1)} epoch-1 samples before the checkpoint, "
             f"the checkpoint says {served}")
    if kept + after != reference:
        fail("checkpointed prefix + resumed run differs from the uninterrupted run")
    if after[: len(lost)] != lost:
        fail("the samples consumed after the checkpoint were not replayed first, in order")
    for e in range(EPOCHS):
        ids = [i for (ep, i) in kept + after if ep == e]
        if sorted(ids) != list(range(n)):
            fail(f"epoch {e}: not every sample exactly once")
    print(f"kill_resume: ok (killed at epoch 1 after {len(lost)} samples past the checkpoint at "
          f"{served}; resumed run matches the uninterrupted one, {EPOCHS} epochs of {n})")


if __name__ == "__main__":
    main()
