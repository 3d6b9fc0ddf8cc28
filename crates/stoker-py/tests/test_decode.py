"""Decoding in Rust through the Python Loader: JPEG/PNG shards written by PIL become fixed
tensors close to PIL's own transform, the same for the same (seed, epoch, index) whatever the
batch size or resume point; bad images raise DecodeError naming the sample or are skipped;
the Python-threads transform hatch delivers every sample once, collated."""

import io
import tarfile

import numpy
import pytest
import torch
from PIL import Image

import stoker

N = 40


def photo(i: int, w: int, h: int) -> Image.Image:
    """A smooth, photo-like RGB image (gradients and a disc) that differs per sample."""
    y, x = numpy.mgrid[0:h, 0:w].astype(numpy.float32)
    r = 128 + 100 * numpy.sin(x / (7 + i % 5)) * numpy.cos(y / 11)
    g = 255 * x / w
    b = numpy.where((x - w / 2) ** 2 + (y - h / 2) ** 2 < (min(w, h) / 3) ** 2, 220, 40 + i)
    return Image.fromarray(numpy.stack([r, g, b], -1).clip(0, 255).astype(numpy.uint8))


def encode(img: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return out.getvalue()


def write_shard(path, members):
    with tarfile.open(path, "w") as tf:
        for name, body in members:
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    images = {}
    members = []
    for i in range(N):
        img = photo(i, 120 + (i * 13) % 90, 90 + (i * 7) % 80)
        fmt = "PNG" if i % 4 == 0 else "JPEG"
        body = encode(img, fmt)
        images[i] = body
        members += [(f"{i:04d}.jpg", body), (f"{i:04d}.cls", str(i % 10).encode())]
    write_shard(root / "train-000.tar", members[: N])
    write_shard(root / "train-001.tar", members[N:])
    return root, images


def center_reference(body: bytes, size: int) -> numpy.ndarray:
    """torchvision's Resize(size * 256 / 224) + CenterCrop(size) on PIL, by hand."""
    img = Image.open(io.BytesIO(body)).convert("RGB")
    w, h = img.size
    short = round(size * 256 / 224)
    nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    return numpy.asarray(img.crop((left, top, left + size, top + size)))


def test_center_crop_matches_pil_and_labels_are_int64(shards):
    root, images = shards
    loader = stoker.Loader(str(root), batch_size=16, decode={"jpg": stoker.Image(64, crop="center"), "cls": stoker.Int()})
    seen = 0
    for batch in loader:
        x, y = batch["jpg"], batch["cls"]
        assert x.dtype == torch.uint8 and x.shape[1:] == (64, 64, 3)
        assert y.dtype == torch.int64 and y.tolist() == [i % 10 for i in batch["__index__"]]
        for row, i in enumerate(batch["__index__"]):
            diff = numpy.abs(x[row].numpy().astype(int) - center_reference(images[i], 64).astype(int))
            assert diff.mean() <= 2.0, f"sample {i}: mean abs diff {diff.mean():.2f} from PIL"
        seen += len(batch["__index__"])
    assert seen == N


def test_layouts_and_normalisation_agree(shards):
    root, _ = shards
    base = {"crop": "random_resized", "flip": True}
    hwc = next(iter(stoker.Loader(str(root), batch_size=8, seed=3, decode={"jpg": stoker.Image(32, **base)})))["jpg"]
    chw = next(iter(stoker.Loader(str(root), batch_size=8, seed=3, decode={"jpg": stoker.Image(32, layout="CHW", **base)})))
    assert torch.equal(chw["jpg"], hwc.permute(0, 3, 1, 2))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    f = next(iter(stoker.Loader(str(root), batch_size=8, seed=3, decode={"jpg": stoker.Image(32, dtype="float32", mean=mean, std=std, **base)})))["jpg"]
    want = (hwc.float() / 255 - torch.tensor(mean)) / torch.tensor(std)
    assert f.dtype == torch.float32 and torch.allclose(f, want, atol=1e-5)
    h = next(iter(stoker.Loader(str(root), batch_size=8, seed=3, decode={"jpg": stoker.Image(32, dtype="float16", **base)})))["jpg"]
    assert h.dtype == torch.float16 and torch.allclose(h.float(), hwc.float() / 255, atol=1e-3)


def by_index(loader):
    out = {}
    for batch in loader:
        for row, i in enumerate(batch["__index__"]):
            out[i] = batch["jpg"][row].clone()
    return out


def test_augmentation_is_a_function_of_seed_epoch_and_index(shards):
    root, _ = shards
    spec = {"jpg": stoker.Image(48, crop="random_resized", flip=True)}
    a = by_index(stoker.Loader(str(root), batch_size=8, shuffle=True, seed=1, decode=spec))
    b = by_index(stoker.Loader(str(root), batch_size=5, shuffle=True, seed=1, decode=spec, decode_threads=1))
    assert a.keys() == b.keys() == set(range(N))
    assert all(torch.equal(a[i], b[i]) for i in range(N)), "same seed, other batch size and threads: same tensors"
    c = by_index(stoker.Loader(str(root), batch_size=8, shuffle=True, seed=2, decode=spec))
    assert sum(torch.equal(a[i], c[i]) for i in range(N)) < N // 4, "another seed draws other crops"
    # Resume mid-epoch in a new loader: the rest of the epoch is byte-identical.
    first = stoker.Loader(str(root), batch_size=8, shuffle=True, seed=1, decode=spec)
    head = {}
    for k, batch in enumerate(first):
        head.update({i: batch["jpg"][r].clone() for r, i in enumerate(batch["__index__"])})
        if k == 1:
            state = first.state_dict()
            break
    again = stoker.Loader(str(root), batch_size=8, shuffle=True, seed=1, decode=spec)
    again.load_state_dict(state)
    tail = by_index(again)
    assert set(head) | set(tail) == set(range(N)) and not set(head) & set(tail)
    assert all(torch.equal(t, a[i]) for i, t in {**head, **tail}.items())


def test_flip_true_flips_half_as_torchvision_and_a_number_is_the_probability(shards):
    root, _ = shards

    def run(flip):
        return by_index(stoker.Loader(str(root), batch_size=8, decode={"jpg": stoker.Image(48, crop="center", flip=flip)}))

    plain, always, coin = run(False), run(1.0), run(True)
    assert all(torch.equal(always[i], plain[i].flip(1)) for i in range(N)), "flip=1.0 mirrors every image"
    flipped = sum(torch.equal(coin[i], always[i]) for i in range(N))
    assert all(torch.equal(coin[i], always[i]) or torch.equal(coin[i], plain[i]) for i in range(N))
    assert N // 5 < flipped < N - N // 5, f"flip=True flipped {flipped} of {N}: RandomHorizontalFlip flips half"
    with pytest.raises(stoker.InvalidInputError, match="probability"):
        stoker.Image(48, flip=1.5)


def test_colour_jitter_grayscale_and_blur_are_functions_of_seed_epoch_and_index(shards):
    root, _ = shards
    plain = {"jpg": stoker.Image(48, crop="random_resized", flip=True)}
    colour = {"jpg": stoker.Image(48, crop="random_resized", flip=True, color_jitter=(0.4, 0.4, 0.4, 0.1),
                                  grayscale=0.3, blur=(5, 0.1, 2.0), blur_p=0.5)}
    a = by_index(stoker.Loader(str(root), batch_size=8, shuffle=True, seed=1, decode=colour))
    b = by_index(stoker.Loader(str(root), batch_size=5, shuffle=True, seed=1, decode=colour, decode_threads=1))
    assert all(torch.equal(a[i], b[i]) for i in range(N)), "same seed, other batch size and threads: same tensors"
    # Resumed mid-epoch in a new loader: the rest of the epoch has the same colours.
    first = stoker.Loader(str(root), batch_size=8, shuffle=True, seed=1, decode=colour)
    for k, batch in enumerate(first):
        if k == 1:
            state = first.state_dict()
            break
    again = stoker.Loader(str(root), batch_size=8, shuffle=True, seed=1, decode=colour)
    again.load_state_dict(state)
    tail = by_index(again)
    assert len(tail) == N - 16 and all(torch.equal(t, a[i]) for i, t in tail.items())
    p = by_index(stoker.Loader(str(root), batch_size=8, shuffle=True, seed=1, decode=plain))
    assert sum(not torch.equal(a[i], p[i]) for i in range(N)) > N * 3 // 4, "the colour of most samples changed"
    gray = [bool((a[i][..., 0] == a[i][..., 1]).all() and (a[i][..., 1] == a[i][..., 2]).all()) for i in range(N)]
    assert 0 < sum(gray) < N // 2, f"RandomGrayscale(0.3) made {sum(gray)} of {N} gray"
    with pytest.raises(stoker.InvalidInputError):
        stoker.Image(48, color_jitter=(0.1, 0.2))
    bad = {"jpg": stoker.Image(48, color_jitter=(0.1, 0.1, 0.1, 0.8))}
    with pytest.raises(stoker.StokerError, match="hue"):
        stoker.Loader(str(root), batch_size=8, decode=bad)
    with pytest.raises(stoker.StokerError, match="blur kernel"):
        stoker.Loader(str(root), batch_size=8, decode={"jpg": stoker.Image(48, blur=(4, 1.0, 2.0))})


def test_bad_images_raise_or_are_skipped_and_counted(tmp_path, shards):
    _, images = shards
    good = images[1]
    members = []
    for i in range(8):
        body = good
        if i == 2:
            body = good[: len(good) // 3]  # truncated JPEG
        elif i == 5:
            body = b"BM" + bytes(60)  # a BMP header
        members += [(f"{i:04d}.jpg", body), (f"{i:04d}.cls", b"1")]
    write_shard(tmp_path / "bad.tar", members)
    spec = {"jpg": stoker.Image(32, crop="center")}
    with pytest.raises(stoker.DecodeError, match="0002") as e:
        list(stoker.Loader(str(tmp_path), batch_size=8, decode=spec))
    assert isinstance(e.value, stoker.CorruptDataError)
    skipping = stoker.Loader(str(tmp_path), batch_size=8, decode=spec, skip_errors=True)
    batches = list(skipping)
    assert [i for b in batches for i in b["__index__"]] == [0, 1, 3, 4, 6, 7]
    assert batches[0]["jpg"].shape == (6, 32, 32, 3)
    assert skipping.stats()["skipped"] == 2


def test_python_transform_hatch_runs_on_threads_in_order(shards):
    root, images = shards

    def fn(sample):
        img = Image.open(io.BytesIO(sample["jpg"])).convert("RGB").resize((16, 16), Image.BILINEAR)
        return {"x": torch.from_numpy(numpy.asarray(img).copy()), "y": int(sample["cls"]), "i": sample["__index__"]}

    loader = stoker.Loader(str(root), batch_size=8, shuffle=True, seed=4, transform=fn, transform_threads=2, prefetch=2)
    order = [i for b in stoker.Loader(str(root), batch_size=8, shuffle=True, seed=4) for i in b["__index__"]]
    got = []
    for batch in loader:
        assert batch["x"].shape[1:] == (16, 16, 3) and batch["y"].tolist() == [i % 10 for i in batch["i"].tolist()]
        got += batch["i"].tolist()
    assert got == order, "the hatch keeps the loader's order"
    # A state taken mid-epoch counts the batches delivered, not those the pool holds ahead.
    first = stoker.Loader(str(root), batch_size=4, shuffle=True, seed=4, transform=fn, transform_threads=2, prefetch=3)
    head = []
    for k, batch in enumerate(first):
        head += batch["i"].tolist()
        if k == 1:
            state = first.state_dict()
            break
    again = stoker.Loader(str(root), batch_size=4, shuffle=True, seed=4, transform=fn, prefetch=3)
    again.load_state_dict(state)
    tail = [i for b in again for i in b["i"].tolist()]
    assert head + tail == [i for b in stoker.Loader(str(root), batch_size=4, shuffle=True, seed=4) for i in b["__index__"]]
    with pytest.raises(stoker.InvalidInputError):
        stoker.Loader(str(root), batch_size=8, transform=fn, transform_threads=0)


def _photo(name: str) -> Image.Image:
    """A real photo shipped with scikit-image (no network)."""
    import skimage.data

    return Image.fromarray(getattr(skimage.data, name)()).convert("RGB")


def _variants():
    """Encoded variants of real photos and how PIL writes them."""
    jpeg = {"quality": 90}
    return [
        ("jpeg-420", "astronaut", "RGB", "JPEG", {**jpeg, "subsampling": 2}),
        ("jpeg-422", "coffee", "RGB", "JPEG", {**jpeg, "subsampling": 1}),
        ("jpeg-444", "chelsea", "RGB", "JPEG", {**jpeg, "subsampling": 0}),
        ("jpeg-progressive", "rocket", "RGB", "JPEG", {**jpeg, "progressive": True}),
        ("jpeg-gray", "coffee", "L", "JPEG", jpeg),
        ("jpeg-cmyk", "chelsea", "CMYK", "JPEG", jpeg),
        ("png-rgb", "astronaut", "RGB", "PNG", {}),
        ("png-rgba", "coffee", "RGBA", "PNG", {}),
        ("png-gray", "chelsea", "L", "PNG", {}),
        ("png-gray-alpha", "rocket", "LA", "PNG", {}),
        ("png-palette", "astronaut", "P", "PNG", {}),
        ("png-16bit", "coffee", "I;16", "PNG", {}),
        ("webp-lossy", "chelsea", "RGB", "WEBP", {"quality": 90}),
        ("webp-lossless", "rocket", "RGB", "WEBP", {"lossless": True}),
        ("webp-alpha", "coffee", "RGBA", "WEBP", {"lossless": True}),
    ]


@pytest.mark.parametrize("name,photo,mode,fmt,kw", _variants(), ids=[v[0] for v in _variants()])
def test_every_codec_variant_decodes_to_pils_pixels(tmp_path, name, photo, mode, fmt, kw):
    img = _photo(photo).resize((200, 150), Image.BILINEAR)
    if mode == "I;16":
        img = Image.fromarray((numpy.asarray(img.convert("L")).astype(numpy.uint16) * 257))
    else:
        img = img.convert(mode)
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    body = out.getvalue()
    write_shard(tmp_path / "one.tar", [("0.img", body)])
    # What PIL gives: for 16-bit gray (mode I;16) that is values clipped at 255, not the high byte.
    want = numpy.asarray(Image.open(io.BytesIO(body)).convert("RGB"))
    spec = {"img": stoker.Image((150, 200), crop="squash")}
    got = next(iter(stoker.Loader(str(tmp_path), batch_size=1, decode=spec)))["img"][0].numpy()
    diff = numpy.abs(got.astype(int) - want.astype(int))
    within = (diff <= 1).mean()
    if fmt == "JPEG":
        # Only the IDCTs' and upsamplers' rounding may differ from libjpeg-turbo's (PIL's).
        assert within >= 0.99 and diff.mean() <= 0.5, f"{name}: {within:.4f} within 1, max {diff.max()}"
    else:
        assert diff.max() <= (3 if name == "webp-lossy" else 0), f"{name}: max diff {diff.max()}"
