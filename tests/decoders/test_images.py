"""Images: ``Image`` features of Examples, MXNet im2rec records (``ImageRecord``), their writer,
resize/crop, the training crop, corrupt images, and a real FIFO fed by another process.

References are Pillow's own decode and resize of the same bytes (exact for PNG; JPEG decoded by
simplejpeg is compared with Pillow's decode of the same file, both libjpeg-turbo).
"""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

PIL = pytest.importorskip("PIL.Image")  # streamio[image]; .ci/run installs it

import streamio  # noqa: E402
from streamio import (DecodeError, Example, FixedLen, Image, ImageRecord,  # noqa: E402
                      RandomResizedCrop, encode_example, encode_image_record)
from streamio.decoders import image as image_module  # noqa: E402
from streamio.errors import StreamioWarning  # noqa: E402

from conftest import FIXTURES  # noqa: E402

ML_IO_IMAGE = FIXTURES / "peer" / "ml-io" / "test_image_0.rec"


def picture(seed: int, height: int, width: int) -> np.ndarray:
    """A smooth random RGB picture (so JPEG keeps it close, as it does photos)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, height // 8), max(2, width // 8), 3), dtype=np.uint8)
    smooth = PIL.fromarray(small).resize((width, height), PIL.BICUBIC)
    return np.asarray(smooth)


def encode(array: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    PIL.fromarray(array).save(buf, fmt, **kw)
    return buf.getvalue()


def pillow(data: bytes, mode: str = "RGB") -> PIL.Image:
    return PIL.open(io.BytesIO(data)).convert(mode)


SIZES = [(40, 60), (64, 48), (33, 71), (50, 50)]
PICTURES = [picture(i, h, w) for i, (h, w) in enumerate(SIZES)]
PNGS = [encode(p, "PNG") for p in PICTURES]
JPEGS = [encode(p, "JPEG", quality=92) for p in PICTURES]
LABELS = [3, 1, 4, 1]


def examples(images):
    return [encode_example({"image/encoded": img, "image/class/label": label})
            for img, label in zip(images, LABELS)]


def example_decoder(**options):
    return Example({"image/encoded": Image(**options), "image/class/label": FixedLen([], "int64")})


# -- the ml-io peer file and im2rec files of our own -----------------------------------------------
def test_image_record_reads_the_ml_io_fixture_as_its_readme_says():
    # README: 1 record; payload = IRHeader(flag=0, label=0.0, id=1, id2=0) + a JPEG.
    records = list(streamio.read_records(str(ML_IO_IMAGE), "recordio"))
    assert len(records) == 1
    batch = ImageRecord().decode_batch(records)
    assert batch["label"].tolist() == [0.0] and batch["label"].dtype == np.float32
    assert batch["id"].tolist() == [1]
    jpeg = records[0][24:]
    assert jpeg[:2] == b"\xff\xd8"
    expected = np.asarray(pillow(jpeg))
    assert batch["image"][0].dtype == np.uint8
    assert batch["image"][0].shape == expected.shape == (166, 190, 3)
    assert np.abs(batch["image"][0].astype(int) - expected).max() <= 2


def test_image_record_matches_the_shared_peer_copy():
    from conftest import peer
    shared = peer("ml-io/test_image_0.rec")
    assert open(shared, "rb").read() == ML_IO_IMAGE.read_bytes()


def test_im2rec_records_round_trip_scalar_labels(tmp_path):
    path = str(tmp_path / "train.rec")
    streamio.write_records(path, "recordio", (
        encode_image_record(png, float(label), id=100 + i) for i, (png, label) in
        enumerate(zip(PNGS, LABELS))))
    ds = streamio.Dataset(path, "recordio", decoder=ImageRecord()).batch(4)
    (batch,) = list(ds)
    assert batch["label"].tolist() == LABELS and batch["label"].dtype == np.float32
    assert batch["id"].tolist() == [100, 101, 102, 103]
    assert batch["image"].dtype == object  # no size: images keep their own sizes
    for got, want in zip(batch["image"], PICTURES):
        assert np.array_equal(got, want)  # PNG is lossless: byte-exact


def test_im2rec_records_round_trip_several_labels_per_record(tmp_path):
    path = str(tmp_path / "multi.rec")
    labels = [[1.0, 0.5, -2.0], [0.0, 3.25, 7.0]]
    streamio.write_records(path, "recordio", [encode_image_record(PNGS[i], labels[i], id=i)
                                              for i in range(2)])
    records = list(streamio.read_records(path, "recordio"))
    assert np.frombuffer(records[0][:4], "<u4")[0] == 3  # flag = number of labels
    batch = ImageRecord(label_width=3, size=16).decode_batch(records)
    assert batch["label"].tolist() == labels
    assert batch["image"].shape == (2, 16, 16, 3)
    with pytest.raises(DecodeError, match=r"3 label.*label_width=3.*record 0"):
        ImageRecord().decode_batch(records)


def test_im2rec_header_cut_short_is_a_decode_error_or_skipped():
    good = encode_image_record(PNGS[0], 5.0, id=7)
    with pytest.raises(DecodeError, match=r"shorter than the 24-byte.*record 11"):
        ImageRecord().decode_batch([good, good[:10]], first_index=10)
    batch = ImageRecord(on_error="skip").decode_batch([good[:10], good, good[:3]])
    assert batch["id"].tolist() == [7] and len(batch["image"]) == 1


# -- Example + Image: JPEG and PNG, with and without resize/crop ---------------------------------
def test_example_png_without_resize_is_pillows_decode_exactly():
    batch = example_decoder().decode_batch(examples(PNGS))
    assert batch["image/class/label"].tolist() == LABELS
    for got, png in zip(batch["image/encoded"], PNGS):
        assert got.dtype == np.uint8 and np.array_equal(got, np.asarray(pillow(png)))


def test_example_png_resize_to_exact_size_is_pillows_resize_exactly():
    batch = example_decoder(resize=(24, 20)).decode_batch(examples(PNGS))
    assert batch["image/encoded"].shape == (4, 24, 20, 3)
    for got, png in zip(batch["image/encoded"], PNGS):
        want = np.asarray(pillow(png).resize((20, 24), PIL.BILINEAR))
        assert np.array_equal(got, want)


def test_example_png_center_crop_is_a_slice_and_pads_small_images():
    batch = example_decoder(crop=(36, 44)).decode_batch(examples(PNGS))
    images = batch["image/encoded"]
    assert images.shape == (4, 36, 44, 3)
    # (40, 60) -> rows 2:38, cols 8:52, as torchvision's center_crop rounds
    assert np.array_equal(images[0], PICTURES[0][2:38, 8:52])
    # odd margins: round(1.5) = 2 and round(7.5) = 8, as torchvision's int(round(...))
    assert np.array_equal(Image(crop=(37, 45)).decode(PNGS[0]), PICTURES[0][2:39, 8:53])
    # (33, 71): 3 rows short -> 1 zero row on top, 2 below (CenterCrop's padding)
    assert np.array_equal(images[2][1:34], PICTURES[2][:, 14:58])
    assert not images[2][0].any() and not images[2][34:].any()


def test_resize_short_side_and_center_crop_equal_the_two_step_transform():
    # torchvision: Resize(30) then CenterCrop(24); ours resamples only the crop's source box.
    batch = example_decoder(resize=30, crop=24).decode_batch(examples(PNGS))
    assert batch["image/encoded"].shape == (4, 24, 24, 3)
    for got, png in zip(batch["image/encoded"], PNGS):
        im = pillow(png)
        w, h = im.size
        rw, rh = (30, int(30 * h / w)) if w <= h else (int(30 * w / h), 30)
        resized = np.asarray(im.resize((rw, rh), PIL.BILINEAR))
        top, left = int(round((rh - 24) / 2)), int(round((rw - 24) / 2))
        want = resized[top:top + 24, left:left + 24]
        assert np.abs(got.astype(int) - want).max() <= 2  # rounding at the box edges only


def test_example_jpeg_is_close_to_pillows_decode_with_and_without_size():
    plain = example_decoder().decode_batch(examples(JPEGS))["image/encoded"]
    sized = example_decoder(size=32).decode_batch(examples(JPEGS))["image/encoded"]
    assert sized.shape == (4, 32, 32, 3) and sized.dtype == np.uint8
    for got, jpeg, original in zip(plain, JPEGS, PICTURES):
        want = np.asarray(pillow(jpeg))
        assert got.shape == want.shape
        assert np.abs(got.astype(int) - want).max() <= 2
        assert np.abs(got.astype(int) - original).mean() < 4  # and it is the picture
    two_step = Image(size=32, dct_scaling=False).decode(JPEGS[1])
    assert np.abs(sized[1].astype(int) - two_step).mean() < 3


def test_pillow_decodes_jpeg_when_simplejpeg_is_missing(monkeypatch):
    codecs = image_module._Codecs.load()
    fast = Image(size=24, dct_scaling=False).decode(JPEGS[0])
    monkeypatch.setattr(codecs, "simplejpeg", None)
    slow = Image(size=24).decode(JPEGS[0])  # Pillow always decodes at full size
    assert np.abs(fast.astype(int) - slow).max() <= 2


def test_dct_scaling_of_a_large_jpeg_stays_close_to_a_full_decode():
    big = encode(picture(9, 480, 640), "JPEG", quality=92)
    fast = Image(size=64).decode(big)     # decoded at 1/4 scale in the DCT domain
    full = Image(size=64, dct_scaling=False).decode(big)
    assert fast.shape == full.shape == (64, 64, 3)
    assert np.abs(fast.astype(int) - full).mean() < 3


def test_layout_chw_grayscale_and_object_arrays():
    chw = Image(size=16, layout="CHW").decode_batch(PNGS)["image"]
    hwc = Image(size=16).decode_batch(PNGS)["image"]
    assert chw.shape == (4, 3, 16, 16) and np.array_equal(chw, hwc.transpose(0, 3, 1, 2))
    gray = Image(channels=1).decode(PNGS[0])
    assert gray.shape == (40, 60, 1)
    assert np.array_equal(gray[:, :, 0], np.asarray(pillow(PNGS[0], "L")))
    assert Image(channels=1).decode(JPEGS[0]).shape == (40, 60, 1)
    assert Image().output_spec()["image"].kind == "object"
    assert Image(size=8, layout="CHW").output_spec()["image"].shape == (3, 8, 8)


def test_rgba_and_palette_pngs_come_out_rgb():
    rgba = np.dstack([PICTURES[0], np.full((40, 60), 7, np.uint8)])
    got = Image().decode(encode(rgba, "PNG"))
    assert np.array_equal(got, PICTURES[0])
    palette = PIL.fromarray(PICTURES[1]).convert("P")
    buf = io.BytesIO()
    palette.save(buf, "PNG")
    assert np.array_equal(Image().decode(buf.getvalue()), np.asarray(palette.convert("RGB")))


# -- the training crop ------------------------------------------------------------------------------
def test_random_resized_crop_is_reproducible_whatever_the_batching():
    make = lambda: Image(crop=RandomResizedCrop(20, seed=5))  # noqa: E731
    whole = make().decode_batch(JPEGS)["image"]
    pieces = np.concatenate([make().decode_batch(JPEGS[:1])["image"],
                             make().decode_batch(JPEGS[1:])["image"]])
    assert whole.shape == (4, 20, 20, 3) and np.array_equal(whole, pieces)
    other_seed = Image(crop=RandomResizedCrop(20, seed=6)).decode_batch(JPEGS)["image"]
    assert not np.array_equal(whole, other_seed)
    later = make()
    later.set_epoch(1)
    assert not np.array_equal(whole, later.decode_batch(JPEGS)["image"])
    copy = pickle.loads(pickle.dumps(later))  # a worker process's copy keeps the epoch
    assert np.array_equal(copy.decode_batch(JPEGS)["image"], later.decode_batch(JPEGS)["image"])


def test_random_resized_crop_params_stay_inside_and_flip_both_ways():
    crop = RandomResizedCrop(8, seed=0)
    flips = set()
    for key in range(200):
        (x0, y0, x1, y1), flip = crop.params(50, 40, key)
        assert 0 <= x0 < x1 <= 50 and 0 <= y0 < y1 <= 40
        area = (x1 - x0) * (y1 - y0) / 2000
        assert 0.05 < area <= 1.0
        flips.add(flip)
    assert flips == {True, False}
    no_flip = RandomResizedCrop(8, seed=0, flip=False)
    assert not any(no_flip.params(50, 40, k)[1] for k in range(50))


def test_a_flipped_full_crop_is_the_mirror_image():
    crop = RandomResizedCrop((40, 60), scale=(1.0, 1.0), ratio=(1.5, 1.5), seed=0)
    key = next(k for k in range(100) if crop.params(60, 40, k)[1])
    # Force that key: the record's CRC picks the draws, so patch the CRC function.
    codecs = image_module._Codecs.load()
    original = codecs.crc32c
    try:
        codecs.crc32c = lambda data: key
        got = Image(crop=crop).decode(PNGS[0])
    finally:
        codecs.crc32c = original
    assert np.array_equal(got, PICTURES[0][:, ::-1])


# -- bad images --------------------------------------------------------------------------------
def corrupt(jpeg: bytes) -> bytes:
    return jpeg[:200] + b"\x00" * 50  # header intact, scan data cut and zeroed


@pytest.mark.parametrize("use_simplejpeg", [True, False])
def test_corrupt_jpeg_is_a_decode_error_naming_the_record(use_simplejpeg, monkeypatch):
    if not use_simplejpeg:
        monkeypatch.setattr(image_module._Codecs.load(), "simplejpeg", None)
    images = [JPEGS[0], JPEGS[1], corrupt(JPEGS[2]), JPEGS[3]]
    with pytest.raises(DecodeError) as info:
        example_decoder(size=16).decode_batch(examples(images), source="train.tfrecord",
                                              first_index=40)
    err = info.value
    assert (err.source, err.record_index, err.field) == ("train.tfrecord", 42, "image/encoded")
    assert "not a decodable image" in str(err) and "record 42" in str(err)
    with pytest.raises(DecodeError, match="record 1"):
        Image().decode_batch([PNGS[0], b"not an image at all"])


def test_corrupt_images_are_skipped_with_their_labels_under_skip_and_warn():
    images = [JPEGS[0], corrupt(JPEGS[1]), PNGS[2], b"\x89PNG\r\n\x1a\ngarbage"]
    batch = example_decoder(size=16, on_error="skip").decode_batch(examples(images))
    assert batch["image/class/label"].tolist() == [LABELS[0], LABELS[2]]
    assert batch["image/encoded"].shape == (2, 16, 16, 3)
    assert np.array_equal(batch["image/encoded"][1], Image(size=16).decode(PNGS[2]))
    with pytest.warns(StreamioWarning) as caught:
        warned = example_decoder(size=16, on_error="warn").decode_batch(examples(images))
    assert ["record 1," in str(w.message) for w in caught] == [True, False]
    assert "record 3," in str(caught[1].message)
    assert warned["image/class/label"].tolist() == [LABELS[0], LABELS[2]]


def test_a_corrupt_image_in_a_dataset_raises_after_the_batches_before_it(tmp_path):
    path = str(tmp_path / "bad.tfrecord")
    images = [PNGS[i % 4] for i in range(12)]
    images[9] = corrupt(JPEGS[0])
    streamio.write_records(path, "tfrecord", [
        encode_example({"image/encoded": img, "image/class/label": i}) for i, img in enumerate(images)])
    ds = streamio.Dataset(path, "tfrecord", decoder=example_decoder(size=8)).batch(4)
    got = []
    with pytest.raises(DecodeError) as info:
        for batch in ds:
            got.append(batch["image/class/label"].tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert info.value.record_index == 9 and info.value.source == path
    skipping = streamio.Dataset(path, "tfrecord",
                                decoder=example_decoder(size=8, on_error="skip")).batch(4)
    labels = [label for batch in skipping for label in batch["image/class/label"].tolist()]
    assert labels == [i for i in range(12) if i != 9]


# -- a real FIFO fed by another process ----------------------------------------------------------
def test_dataset_over_a_fifo_gives_uint8_image_batches_with_labels(fifo):
    n = 40
    records = [encode_example({"image/encoded": (JPEGS if i % 2 else PNGS)[i % 4],
                               "image/class/label": i}) for i in range(n)]
    data = b"".join(streamio.formats.tfrecord.encode_tfrecord(r) for r in records)
    pipe = fifo.make(data, 1, 7, 4093, 65537, 3)
    ds = streamio.Dataset(pipe, "tfrecord", decoder=example_decoder(resize=20, crop=16)).batch(8)
    batches = list(ds)
    assert [b["image/encoded"].shape for b in batches] == [(8, 16, 16, 3)] * 5
    assert all(b["image/encoded"].dtype == np.uint8 for b in batches)
    labels = np.concatenate([b["image/class/label"] for b in batches])
    assert labels.tolist() == list(range(n))
    expected = Image(resize=20, crop=16).decode(PNGS[2])
    assert np.array_equal(batches[0]["image/encoded"][2], expected)


def test_image_records_over_a_fifo(fifo, tmp_path):
    path = str(tmp_path / "train.rec")
    streamio.write_records(path, "recordio", [encode_image_record(JPEGS[i % 4], i % 10, id=i)
                                              for i in range(30)])
    pipe = fifo.make(open(path, "rb").read(), 5, 1000, 3)
    ds = streamio.Dataset(pipe, "recordio", decoder=ImageRecord(size=12, layout="CHW")).batch(16)
    batches = list(ds)
    assert [b["image"].shape for b in batches] == [(16, 3, 12, 12), (14, 3, 12, 12)]
    assert np.concatenate([b["id"] for b in batches]).tolist() == list(range(30))
    assert np.concatenate([b["label"] for b in batches]).tolist() == [i % 10 for i in range(30)]


# -- API hygiene ---------------------------------------------------------------------------------
def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError):
        Image(size=224, crop=200)
    with pytest.raises(ValueError):
        Image(resize=100, crop=128)
    with pytest.raises(ValueError):
        Image(resize=(100, 50), crop=(90, 60))
    with pytest.raises(ValueError):
        Image(channels=4)
    with pytest.raises(ValueError):
        Image(layout="NHWC")
    with pytest.raises(ValueError):
        Image(on_error="ignore")
    with pytest.raises(TypeError):
        Image(size=2.5)
    with pytest.raises(ValueError):
        Image(crop=RandomResizedCrop(8), resize=10)
    with pytest.raises(TypeError):
        Image(quality=3)  # unknown keywords are errors
    with pytest.raises(ValueError):
        ImageRecord(label_width=0)
    with pytest.raises(ValueError):
        RandomResizedCrop(8, scale=(0.5, 0.1))
    with pytest.raises(ValueError):
        encode_image_record(PNGS[0], [])


def test_decoders_pickle_and_describe_their_output():
    dec = example_decoder(size=16, on_error="skip")
    copy = pickle.loads(pickle.dumps(dec))
    assert copy.output_spec() == dec.output_spec()
    assert dec.output_spec()["image/encoded"] == streamio.FieldSpec("dense", np.uint8, (16, 16, 3))
    batch = copy.decode_batch(examples(PNGS))
    assert batch["image/encoded"].shape == (4, 16, 16, 3)
    rec = ImageRecord(label_width=2, size=8)
    assert pickle.loads(pickle.dumps(rec)).output_spec() == rec.output_spec()
    assert rec.output_spec()["label"].shape == (2,)
    assert "Image(resize=16, crop=(16, 16)" in repr(dec)


def test_to_tf_with_an_image_decoder(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "img.tfrecord")
    streamio.write_records(path, "tfrecord", examples(JPEGS) * 3)
    ds = streamio.Dataset(path, "tfrecord", decoder=example_decoder(size=16)).batch(5)
    tfds = ds.to_tf()
    assert tfds.element_spec["image/encoded"] == tf.TensorSpec((None, 16, 16, 3), tf.uint8)
    batches = list(tfds)
    assert [b["image/encoded"].shape[0] for b in batches] == [5, 5, 2]
    assert np.array_equal(batches[0]["image/encoded"].numpy(), next(iter(ds))["image/encoded"])


def test_huge_images_are_refused_before_their_pixels_are_allocated():
    for data in (PNGS[0], JPEGS[0]):
        with pytest.raises(DecodeError, match="max_pixels=100"):
            Image(max_pixels=100).decode(data)
    # A JPEG whose frame header claims 60000 x 60000 pixels (10 GB of RGB) behind 200 bytes.
    sof = JPEGS[0].index(b"\xff\xc0")
    huge = bytearray(JPEGS[0])
    huge[sof + 5:sof + 9] = (60000).to_bytes(2, "big") * 2
    with pytest.raises(DecodeError, match="60000x60000"):
        Image().decode(bytes(huge))
    png = bytearray(PNGS[0])  # IHDR width and height at bytes 16..24 (the CRC no longer matches)
    png[16:24] = (60000).to_bytes(4, "big") * 2
    with pytest.raises(DecodeError):
        Image().decode(bytes(png))


def test_image_record_skips_bad_headers_and_bad_images_naming_each_record():
    good = [encode_image_record(JPEGS[i], float(i), id=i) for i in range(4)]
    bad_image = encode_image_record(corrupt(JPEGS[0]), 9.0, id=99)
    records = [good[0][:5], good[1], bad_image, good[3]]
    with pytest.warns(StreamioWarning) as caught:
        batch = ImageRecord(size=8, on_error="warn").decode_batch(records, first_index=20)
    assert batch["id"].tolist() == [1, 3] and batch["label"].tolist() == [1.0, 3.0]
    assert batch["image"].shape == (2, 8, 8, 3)
    messages = [str(w.message) for w in caught]
    assert "record 20)" in messages[0] and "im2rec" in messages[0]
    assert "record 22," in messages[1] and "decodable image" in messages[1]
    with pytest.raises(DecodeError, match="record 22"):
        ImageRecord(size=8).decode_batch(records[1:], first_index=21)


def test_dct_scaling_uses_only_the_fast_scales(monkeypatch):
    """1/2, 1/4 and 1/8 (SIMD IDCTs in libjpeg-turbo) or the full size, never 3/4 or 5/8 (its
    plain-C IDCTs, slower than a full decode)."""
    codecs = image_module._Codecs.load()
    if codecs.simplejpeg is None:
        pytest.skip("simplejpeg is not installed")
    real = codecs.simplejpeg
    shapes = []

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def decode_jpeg(self, data, **kwargs):
            pixels = real.decode_jpeg(data, **kwargs)
            shapes.append(pixels.shape[:2])
            return pixels

    monkeypatch.setattr(codecs, "simplejpeg", Spy())
    photo = encode(picture(3, 375, 500), "JPEG", quality=90)
    big = encode(picture(9, 480, 640), "JPEG", quality=92)
    Image(resize=256, crop=224).decode(photo)  # needs 0.68 of it: 3/4 would do, full is faster
    Image(size=64).decode(big)                 # needs 0.15: 1/4
    Image(size=120).decode(big)                # needs 0.25: 1/4 exactly
    Image(size=30).decode(big)                 # needs 0.0625: 1/8 is the smallest
    assert shapes == [(375, 500), (120, 160), (120, 160), (60, 80)]


def test_decoded_images_are_writable_arrays_of_their_own():
    for image in (Image(size=16).decode(JPEGS[0]), Image().decode(PNGS[0]),
                  Image().decode_batch(JPEGS)["image"][1], Image(size=16).decode_batch(PNGS)["image"]):
        # torch.from_numpy takes them without a copy or a warning about read-only memory
        assert image.flags.writeable and image.flags.c_contiguous
