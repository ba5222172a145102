"""``fluid.dataset``: Fluid 1.x's module path of the datasets (``pdjit.io.dataset``)."""
from pdjit.io.dataset import (  # noqa: F401
    DatasetBase,
    DatasetError,
    DatasetFactory,
    InMemoryDataset,
    QueueDataset,
)

__all__ = ["DatasetFactory", "DatasetBase", "InMemoryDataset", "QueueDataset", "DatasetError"]
