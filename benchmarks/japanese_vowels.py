"""JapaneseVowels (UCI; 9 speakers, 12 LPC coefficients a step) as a long table for
`data=sequences`, from the `.ts` files bundled in aeon's wheel (no download).

    pip install aeon   # the `bench` extra: not what training needs
    python benchmarks/japanese_vowels.py --out data/japanese_vowels.csv

Writes one row per time step: `id`, `time`, `label` (the speaker, 1-9), `split` (the archive's
270 train and 370 test utterances) and the coefficients `c1`..`c12`.
"""

import argparse
import csv
from pathlib import Path


def main() -> None:
    from aeon.datasets import load_classification  # the bench extra

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/japanese_vowels.csv"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        table = csv.writer(f)
        table.writerow(["id", "time", "label", "split", *(f"c{j + 1}" for j in range(12))])
        number, lengths = 0, []
        for split in ("train", "test"):
            series, labels = load_classification(
                "JapaneseVowels", split=split, load_equal_length=False
            )
            for channels, label in zip(series, labels, strict=True):  # channels: (12, length)
                for time, step in enumerate(channels.T):
                    table.writerow([number, time, label, split, *(f"{v:.6g}" for v in step)])
                number += 1
                lengths.append(channels.shape[1])
    print(f"{args.out}: {number} sequences, {min(lengths)}-{max(lengths)} steps")


if __name__ == "__main__":
    main()
