#!/usr/bin/env python3
"""PyTorch DataLoader over the ImageFolder files (the paper's baseline).

A map-style Dataset whose __getitem__ opens, reads and closes one file into a
uint8 tensor; DataLoader(shuffle=True) with num_workers worker processes, a
collate that keeps the variable-length samples as a list (tensors travel to
the main process through shared memory, as usual).

    torch_files.py FILES_DIR --workers 8 --batch-size 64 --seed 1
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    import torch
    from torch.utils.data import DataLoader, Dataset

    items = common.list_files(a.files)

    class Files(Dataset):
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            path, label = items[i]
            data = common.read_file(path)
            return i, label, torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def collate(batch):
        return [b[0] for b in batch], torch.tensor([b[1] for b in batch]), [b[2] for b in batch]

    g = torch.Generator()
    g.manual_seed(a.seed)
    loader = DataLoader(Files(), batch_size=a.batch_size, shuffle=True, generator=g, num_workers=a.workers,
                        collate_fn=collate, persistent_workers=False)
    seen = bytearray(len(items))

    def count(batch):
        ids, _labels, tensors = batch
        for i in ids:
            seen[i] += 1
        return len(ids), sum(t.numel() for t in tensors)

    common.ready_and_wait()
    ep = common.Epoch().consume(loader, count)
    common.say({"result": ep.result(exactly_once=all(s == 1 for s in seen), workers=a.workers)})


if __name__ == "__main__":
    common.main_guard(main)
