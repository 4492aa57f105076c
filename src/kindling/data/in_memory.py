"""In-memory data sets served a batch at a time: one index operation per batch, instead of one
`__getitem__` per sample and a collate that stacks them."""

import torch
from torch.utils.data import TensorDataset


class BatchIndexedTensors(TensorDataset):
    """Tensors of equal length whose batches are taken with one index per tensor.

    A DataLoader with a batch size hands `__getitems__` all the indices of a batch (torch's
    fetcher does, when a data set has it); `collate` passes the stacked batch through. Samplers,
    `DistributedSampler` included, work as for any data set, and `__getitem__` serves one sample.
    """

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        return tuple(tensor[index] for tensor in self.tensors)

    @staticmethod
    def collate(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return batch
