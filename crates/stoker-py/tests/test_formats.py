"""Formats users already have, read as they are: a Hugging Face `datasets` Parquet export with an
`Image` feature, MosaicML MDS shards and LitData chunks, written by the real writers (in
.venv-peers, run as subprocesses: they pin a numpy this venv cannot take), through PyTorch's real
DataLoader and through stoker.Loader, bytes checked against what the writers report."""

import io
import json
from pathlib import Path

import numpy
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
import writers

ROOT = Path(__file__).resolve().parents[3]


def write(script: str, kind: str, out: Path):
    """Run integration/py/SCRIPT KIND OUT; the samples it reports: [(key, {field: bytes})]."""
    res = writers.run(script, kind, out)
    assert res.returncode == 0, f"{script} {kind} failed (run integration/setup.sh): {res.stderr[-2000:]}"
    return [(s["key"], {n: bytes.fromhex(h) for n, h in s["fields"]}) for s in json.loads(res.stdout)]


def keep(batch):
    return batch


@pytest.mark.parametrize("workers", [0, 2])
def test_hf_image_parquet_through_the_torch_dataloader(tmp_path, workers):
    want = write("write_parquet.py", "hf", tmp_path / "hf")
    ds = stoker.open(str(tmp_path / "hf"))
    assert ds.info()["layout"] == "parquet" and len(ds) == len(want)
    dl = DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers, collate_fn=keep,
                    multiprocessing_context="fork" if workers else None)
    got = {s["__key__"]: s for b in dl for s in b}
    assert sorted(got) == sorted(k for k, _ in want)
    for key, fields in want:
        sample = got[key]
        assert {k: v for k, v in sample.items() if k != "__key__"} == fields
        # The image is the PNG HF stored: PIL opens it.
        from PIL import Image
        assert Image.open(io.BytesIO(sample["image"])).size[0] >= 8


def test_hf_parquet_through_the_loader_decodes_images_and_labels(tmp_path):
    want = write("write_parquet.py", "hf", tmp_path / "hf")
    loader = stoker.Loader(str(tmp_path / "hf"), batch_size=5, shuffle=True, seed=1, columns=["image", "label"],
                           decode={"image": stoker.Image(size=8, crop="squash"), "label": stoker.Int()})
    labels = {}
    for batch in loader:
        images, lab = batch["image"], batch["label"]
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) in ((8, 8, 3), (3, 8, 8))
        assert "text" not in batch, "columns= leaves the text out"
        for key, label in zip(batch["__key__"], lab.tolist()):
            labels[key] = label
    assert labels == {k: int(f["label"]) for k, f in want}


@pytest.mark.parametrize("kind", ["mds", "mds-zstd", "litdata", "litdata-rows"])
def test_mds_and_litdata_through_the_loader_byte_for_byte(tmp_path, kind):
    want = dict(write("write_records.py", kind, tmp_path / kind))
    loader = stoker.Loader(str(tmp_path / kind), batch_size=7, shuffle=True, seed=2)
    seen = []
    for batch in loader:
        for row, key in enumerate(batch["__key__"]):
            for name, value in want[key].items():
                data, offsets = batch[name]
                assert bytes(data[offsets[row]:offsets[row + 1]].numpy()) == value, (key, name)
            seen.append(key)
    assert sorted(seen) == sorted(want)
    # Arrays arrive as .npy: numpy loads them back.
    if kind.startswith("mds"):
        arr = numpy.load(io.BytesIO(stoker.open(str(tmp_path / kind))[0]["arr"]))
        assert arr.dtype == numpy.float32 and arr.shape == (4,)


def test_a_pickle_column_is_refused_with_a_clear_error(tmp_path):
    write("write_records.py", "mds", tmp_path / "mds")
    index = tmp_path / "mds/index.json"
    index.write_text(index.read_text().replace('"json"', '"pkl"'))
    with pytest.raises(stoker.StokerError, match="(?s)pickle.*columns="):
        stoker.open(str(tmp_path / "mds"))
    # Leaving it out reads.
    assert "meta" not in stoker.open(str(tmp_path / "mds"), columns=["cls"])[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_h5py_files_through_the_torch_dataloader_and_the_loader(tmp_path, workers):
    want = dict(write("write_hdf5.py", "mixed", tmp_path / "h5"))
    ds = stoker.open(str(tmp_path / "h5"))
    assert ds.info()["layout"] == "hdf5" and len(ds) == len(want)
    dl = DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers, collate_fn=keep,
                    multiprocessing_context="fork" if workers else None)
    got = {s["__key__"]: s for b in dl for s in b}
    assert got.keys() == want.keys()
    for key, fields in want.items():
        assert {k: v for k, v in got[key].items() if k != "__key__"} == fields, key
    # The Loader stacks the arrays: `emb` rows are (8,) float32, `pixels` (6, 5, 3) uint8.
    loader = stoker.Loader(str(tmp_path / "h5"), batch_size=16, shuffle=True, seed=3, columns=["label", "emb", "pixels"],
                           decode={"label": stoker.Int(), "emb": stoker.Npy(), "pixels": stoker.Npy()})
    seen = 0
    for batch in loader:
        assert batch["emb"].dtype == torch.float32 and tuple(batch["emb"].shape[1:]) == (8,)
        assert batch["pixels"].dtype == torch.uint8 and tuple(batch["pixels"].shape[1:]) == (6, 5, 3)
        for row, key in enumerate(batch["__key__"]):
            assert batch["label"][row].item() == int(want[key]["label"])
            assert batch["emb"][row].numpy().tobytes() == numpy.load(io.BytesIO(want[key]["emb"])).tobytes()
            seen += 1
    assert seen == len(want)
