# kindling on the official PyTorch image: torch, torchvision, CUDA 12 and cuDNN 9 come with it.
#   docker build -t kindling .
#   docker run --gpus all --ipc=host -v "$PWD/logs:/workspace/kindling/logs" \
#       -v "$PWD/data:/workspace/kindling/data" kindling trainer=gpu
# Arguments after the image name are train.py overrides. --ipc=host gives DDP and DataLoader
# workers the shared memory they need (Docker's default /dev/shm is 64 MB).
FROM pytorch/pytorch:2.14.1-cuda12.6-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /workspace/kindling

# Dependencies first, so that editing configs or tests does not reinstall them. The image's torch
# and torchvision satisfy pyproject.toml, so pip keeps them and their CUDA build.
COPY pyproject.toml README.md ./
COPY src ./src
# export: python -m kindling.export runs in the image too.
RUN pip install -e ".[trackers,export]"
COPY . .

ENTRYPOINT ["python", "train.py"]
