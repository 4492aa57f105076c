"""Length bucketing against plain shuffling: the share of padded steps, and training steps/s.

    python benchmarks/sequence_buckets.py --sequences 2000 --min-length 20 --max-length 200

Writes a long table of `--sequences` random sequences (12 features, lengths drawn uniformly from
`--min-length` to `--max-length`: a 10x spread by default), loads it with `data=sequences`'
data module with `data.bucket=false` and `true`, and trains a 2-layer LSTM (hidden 64, packed
sequences) on each epoch's batches, timing the steps. Prints one row per order.
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet
import torch
import torch.nn.functional as F

from kindling.data.sequences import SequenceTableDataModule
from kindling.models.recurrent import LSTMClassifier

FEATURES = 12


def write_table(path: Path, sequences: int, lengths: tuple[int, int], seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    steps = rng.integers(lengths[0], lengths[1], sequences, endpoint=True)
    ids = np.repeat(np.arange(sequences), steps)
    columns = {
        "id": ids,
        "time": np.concatenate([np.arange(n) for n in steps]),
        "label": ids % 4,
        **{f"f{j}": rng.normal(size=len(ids)) for j in range(FEATURES)},
    }
    pyarrow.parquet.write_table(pa.table(columns), path)


def measure(table: Path, bucket: bool, batch_size: int, epochs: int) -> dict[str, float]:
    data = SequenceTableDataModule(str(table), FEATURES, 4, batch_size=batch_size, bucket=bucket)
    data.setup()
    torch.manual_seed(0)
    net = LSTMClassifier(None, 4, hidden_size=64, num_features=FEATURES)
    optimizer = torch.optim.AdamW(net.parameters())
    real = padded = steps = 0
    start = time.perf_counter()
    for epoch in range(epochs):
        loader = data.train_dataloader()
        loader.sampler.set_epoch(epoch)
        for inputs, lengths, labels in loader:
            loss = F.cross_entropy(net(inputs, lengths), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            real, padded, steps = (
                real + int(lengths.sum()),
                padded + inputs[..., 0].numel(),
                steps + 1,
            )
    seconds = time.perf_counter() - start
    return {"padding": 1 - real / padded, "steps_per_s": steps / seconds, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--min-length", type=int, default=20)
    parser.add_argument("--max-length", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        table = Path(folder) / "sequences.parquet"
        write_table(table, args.sequences, (args.min_length, args.max_length))
        threads = torch.get_num_threads()
        print(f"{args.sequences} sequences of {args.min_length}-{args.max_length} steps, "
              f"batch {args.batch_size}, LSTM hidden 64, {threads} threads")  # fmt: skip
        print("| order | padded steps | training steps/s | steps |")
        print("| --- | ---: | ---: | ---: |")
        for bucket in (False, True):
            result = measure(table, bucket, args.batch_size, args.epochs)
            name = "data.bucket=true" if bucket else "shuffled (default)"
            print(f"| {name} | {result['padding']:.1%} | {result['steps_per_s']:.1f} | "
                  f"{result['steps']} |")  # fmt: skip


if __name__ == "__main__":
    main()
