"""The pictures in the manual (docs/images/), made by real runs so they stay true:
`python scripts/manual_pictures.py` trains the default experiment for 10 epochs (its learning
curves and confusion matrix) and runs a multirun of two models and two seeds (its report), on the
CPU, in a temporary folder; about a minute on 2 cores."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"


def train(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "train.py"), *args, "trainer=cpu"], cwd=cwd,
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        train("trainer.max_epochs=10", f"hydra.run.dir={folder / 'run'}", cwd=folder)
        for name in ("learning_curves.png", "confusion_matrix.png"):
            shutil.copy(folder / "run" / name, IMAGES / name)
        sweep = folder / "sweep"
        train("-m", "model=cnn,lstm", "seed=0,1", "trainer.max_epochs=3",
              f"hydra.sweep.dir={sweep}", cwd=folder)  # fmt: skip
        shutil.copy(sweep / "report.png", IMAGES / "multirun_report.png")
    print(f"Wrote {IMAGES}: learning_curves.png, confusion_matrix.png, multirun_report.png")


if __name__ == "__main__":
    main()
