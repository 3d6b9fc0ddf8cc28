"""Read Megatron indexed datasets with Megatron-LM's own reader and print every document's
token ids as JSON (a list per document, datasets in the order given).

    python read_megatron.py PREFIX [PREFIX ...]    # PREFIX.bin + PREFIX.idx
"""
import json
import sys
import warnings

warnings.filterwarnings("ignore")  # Megatron warns that Transformer Engine and Apex are absent
from megatron.core.datasets.indexed_dataset import IndexedDataset  # noqa: E402

out = []
for prefix in sys.argv[1:]:
    ds = IndexedDataset(prefix)
    out += [[int(t) for t in ds[i]] for i in range(len(ds))]
json.dump(out, sys.stdout)
