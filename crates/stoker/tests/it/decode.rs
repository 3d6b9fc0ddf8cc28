//! Decoding in the Loader: fixed schema, labels and arrays, errors naming the sample, the skip
//! policy, and augmentation that depends only on (seed, epoch, index): reruns, resumes and
//! elastic runs give byte-identical tensors.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use stoker::decode::{Crop, DecodeSpec, Dtype, FieldDecode, FixedSpec, ImageSpec, NpySpec};
use stoker::loader::{ErrorPolicy, Loader, LoaderConfig, LoaderState};
use stoker::sampler::{Order, Partition, Tail};
use stoker::{DynSampleSource, Error, Sample};

/// A PNG of `w` x `h` whose pixels depend on `seed` (so crops of different places differ).
fn png(seed: usize, w: u32, h: u32) -> Vec<u8> {
    let mut px = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let v = (x as usize * 7 + y as usize * 13 + seed * 31) as u32;
            px.extend([(v % 256) as u8, ((v * 3 + x) % 256) as u8, ((v ^ (y * 5)) % 256) as u8]);
        }
    }
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(&px).unwrap();
    out
}

fn npy_f32(values: &[f32], shape: &str) -> Vec<u8> {
    let mut h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend((h.len() as u16).to_le_bytes());
    v.extend(h.as_bytes());
    for x in values {
        v.extend(x.to_le_bytes());
    }
    v
}

/// `n` image samples (`png`, `cls`, `npy`, `txt`) in shards of 16 under `dir`.
fn image_shards(dir: &std::path::Path, n: usize) -> Vec<Sample> {
    let mut all = Vec::new();
    for s in 0..n.div_ceil(16) {
        let samples: Vec<Sample> = (s * 16..n.min(s * 16 + 16))
            .map(|i| {
                let (w, h) = (40 + (i * 17 % 80) as u32, 30 + (i * 29 % 70) as u32);
                sample(
                    &format!("img{i:05}"),
                    &[
                        ("png", png(i, w, h)),
                        ("cls", format!(" {}\n", i % 1000).into_bytes()),
                        ("npy", npy_f32(&[i as f32, 0.5, -1.0], "(3,)")),
                        ("txt", format!("caption {}", "x".repeat(i % 7)).into_bytes()),
                    ],
                )
            })
            .collect();
        write_tar(&dir.join(format!("train-{s:03}.tar")), &samples);
        all.extend(samples);
    }
    all
}

fn spec() -> DecodeSpec {
    DecodeSpec::new()
        .with(
            "png",
            FieldDecode::Image(ImageSpec {
                size: [24, 32],
                crop: Crop::random_resized(),
                flip: 0.5,
                ..ImageSpec::default()
            }),
        )
        .with("cls", FieldDecode::Int)
        .with("npy", FieldDecode::Npy(NpySpec::default()))
}

fn loader(src: &Arc<DynSampleSource>, batch: usize, partition: Partition, threads: usize) -> Loader {
    let mut cfg = LoaderConfig::new(batch);
    cfg.order = Order::Shuffle { seed: 11 };
    cfg.partition = partition;
    cfg.tail = Tail::Drop;
    cfg.decode = Some(spec());
    cfg.augment_seed = 5;
    cfg.transform_threads = threads;
    Loader::new(src.clone(), cfg).unwrap()
}

/// Every delivered sample's decoded image bytes, by source index.
fn images(loader: &Loader, epoch: u64, take: usize) -> BTreeMap<u64, Vec<u8>> {
    let mut out = BTreeMap::new();
    for b in loader.epoch_blocking(epoch).unwrap().take(take) {
        let b = b.unwrap();
        let col = b.field("png").unwrap();
        for (row, &i) in b.indices().iter().enumerate() {
            out.insert(i, col.get(row).unwrap().to_vec());
        }
    }
    out
}

fn setup(n: usize) -> (tempfile::TempDir, Vec<Sample>, Arc<DynSampleSource>, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let samples = image_shards(dir.path(), n);
    let src = rt.block_on(open(dir.path().to_str().unwrap()));
    (dir, samples, src, rt)
}

#[test]
fn decoded_columns_have_a_fixed_type_and_right_values() {
    let (_dir, samples, src, _rt) = setup(70);
    let l = loader(&src, 16, Partition::single(), 2);
    let mut rows = 0;
    for b in l.epoch_blocking(0).unwrap() {
        let b = b.unwrap();
        let img = b.field("png").unwrap();
        let ty = img.ty.expect("a decoded image column has a type");
        assert_eq!((ty.dtype, ty.shape.as_slice()), (Dtype::U8, &[24, 32, 3][..]));
        assert_eq!(img.data.len(), b.len() * 24 * 32 * 3);
        let cls = b.field("cls").unwrap();
        assert_eq!((cls.ty.unwrap().dtype, cls.ty.unwrap().shape.len()), (Dtype::I64, 0));
        let npy = b.field("npy").unwrap();
        assert_eq!((npy.ty.unwrap().dtype, npy.ty.unwrap().shape.as_slice()), (Dtype::F32, &[3][..]));
        // Not in the spec: raw bytes with offsets, never typed, whatever the lengths.
        let txt = b.field("txt").unwrap();
        assert!(txt.ty.is_none());
        for (row, &i) in b.indices().iter().enumerate() {
            let want = &samples[i as usize];
            let label = i64::from_ne_bytes(cls.get(row).unwrap().try_into().unwrap());
            assert_eq!(label, (i % 1000) as i64);
            let arr: Vec<f32> =
                npy.get(row).unwrap().chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
            assert_eq!(arr, [i as f32, 0.5, -1.0]);
            assert_eq!(txt.get(row).unwrap(), &want.field("txt").unwrap()[..]);
            assert!(img.get(row).unwrap().iter().any(|&p| p != 0), "sample {i} decoded to black");
        }
        rows += b.len();
    }
    assert_eq!(rows, 70, "the short last batch keeps the same types");
}

#[test]
fn augmentation_depends_only_on_seed_epoch_and_index() {
    let (_dir, _samples, src, _rt) = setup(96);
    // Reruns, with another thread count: identical.
    let a = images(&loader(&src, 8, Partition::single(), 2), 1, usize::MAX);
    let b = images(&loader(&src, 8, Partition::single(), 1), 1, usize::MAX);
    assert_eq!(a.len(), 96);
    assert_eq!(a, b, "the same seed gives the same bytes whatever the thread count");
    // Another epoch draws other crops.
    let c = images(&loader(&src, 8, Partition::single(), 2), 2, usize::MAX);
    assert_ne!(a, c, "epochs draw different augmentations");
    // Another batch size and order of delivery: the same tensor per sample.
    let d = images(&loader(&src, 5, Partition::single(), 2), 1, usize::MAX);
    assert_eq!(a, d);
}

#[test]
fn resumed_and_elastic_runs_give_identical_tensors() {
    let (_dir, _samples, src, _rt) = setup(96);
    let whole = images(&loader(&src, 8, Partition::single(), 2), 3, usize::MAX);
    // Resume after a random-ish number of batches.
    let first = loader(&src, 8, Partition::single(), 2);
    let head = images(&first, 3, 5);
    let state: LoaderState = first.state().unwrap();
    let second = loader(&src, 8, Partition::single(), 2);
    second.load_state(state).unwrap();
    let tail = images(&second, 3, usize::MAX);
    assert_eq!(head.len() + tail.len(), 96);
    for (i, t) in head.iter().chain(tail.iter()) {
        assert_eq!(whole.get(i), Some(t), "sample {i} differs after a resume");
    }
    // Elastic: 4 ranks read part of the epoch, then 3 ranks resume from the saved state.
    let ranks: Vec<Loader> = (0..4).map(|r| loader(&src, 4, Partition::new(r, 4).unwrap(), 1)).collect();
    let mut seen = BTreeMap::new();
    for l in &ranks {
        seen.extend(images(l, 3, 3));
    }
    let state = ranks[0].state().unwrap();
    for r in 0..3 {
        let l = loader(&src, 4, Partition::new(r, 3).unwrap(), 1);
        l.load_state(state.clone()).unwrap();
        for (i, t) in images(&l, 3, usize::MAX) {
            assert!(seen.insert(i, t).is_none(), "sample {i} delivered twice across the resize");
        }
    }
    assert_eq!(seen.len(), 96, "every sample once across 4 then 3 ranks");
    assert_eq!(seen, whole, "every sample's tensor equals the uninterrupted single-rank run's");
}

#[test]
fn bad_samples_are_named_or_skipped_and_counted() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut samples = image_shards(dir.path(), 16);
    // Sample 5: a PNG cut short; sample 9: not an image at all; sample 12: label "seven".
    let mut cut = samples[5].field("png").unwrap().to_vec();
    cut.truncate(cut.len() / 2);
    samples[5].fields[0].data = cut.into();
    samples[9].fields[0].data = b"GIF89a not really".to_vec().into();
    samples[12].fields[1].data = b"seven".to_vec().into();
    write_tar(&dir.path().join("train-000.tar"), &samples);
    let src = rt.block_on(open(dir.path().to_str().unwrap()));
    let mut cfg = LoaderConfig::new(16);
    cfg.decode = Some(spec());
    let l = Loader::new(src.clone(), cfg.clone()).unwrap();
    let err = l.epoch_blocking(0).unwrap().next().unwrap().unwrap_err();
    assert!(matches!(err, Error::Decode { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("img00005") && msg.contains("png") && msg.contains("train-000"), "{msg}");
    cfg.on_error = ErrorPolicy::Skip;
    let l = Loader::new(src, cfg).unwrap();
    let b = l.epoch_blocking(0).unwrap().next().unwrap().unwrap();
    let got: Vec<u64> = b.indices().to_vec();
    assert_eq!(got, (0..16).filter(|i| ![5, 9, 12].contains(i)).collect::<Vec<u64>>());
    assert_eq!(l.stats().skipped, 3);
    assert_eq!(b.field("png").unwrap().data.len(), 13 * 24 * 32 * 3);
}

#[test]
fn arrays_of_another_shape_and_wrong_fixed_widths_are_refused_by_name() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut samples = image_shards(dir.path(), 8);
    samples[6].fields[2].data = npy_f32(&[1.0, 2.0], "(2,)").into();
    write_tar(&dir.path().join("train-000.tar"), &samples);
    let src = rt.block_on(open(dir.path().to_str().unwrap()));
    let mut cfg = LoaderConfig::new(8);
    cfg.decode = Some(DecodeSpec::new().with("npy", FieldDecode::Npy(NpySpec::default())));
    let err = Loader::new(src.clone(), cfg.clone()).unwrap().epoch_blocking(0).unwrap().next().unwrap().unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("img00006") && msg.contains("[2]") && msg.contains("[3]"), "{msg}");
    cfg.decode =
        Some(DecodeSpec::new().with("cls", FieldDecode::Fixed(FixedSpec { dtype: Dtype::U8, shape: vec![4] })));
    let err = Loader::new(src.clone(), cfg.clone()).unwrap().epoch_blocking(0).unwrap().next().unwrap().unwrap_err();
    assert!(err.to_string().contains("declared uint8 [4]"), "{err}");
    // A declared width of no bytes takes empty values only: the labels are not dropped.
    cfg.decode =
        Some(DecodeSpec::new().with("cls", FieldDecode::Fixed(FixedSpec { dtype: Dtype::U8, shape: vec![0] })));
    let err = Loader::new(src.clone(), cfg.clone()).unwrap().epoch_blocking(0).unwrap().next().unwrap().unwrap_err();
    assert!(err.to_string().contains("declared uint8 [0]"), "{err}");
    cfg.decode = Some(DecodeSpec::new().with("nope", FieldDecode::Int));
    let err = Loader::new(src.clone(), cfg.clone()).unwrap().epoch_blocking(0).unwrap().next().unwrap().unwrap_err();
    assert!(err.to_string().contains("has no such field") && err.to_string().contains("png"), "{err}");
    // A declared value may take 1 GiB a row, but not a batch no machine could allocate: that
    // allocation would abort the process, so the Loader refuses it when made. Its largest
    // batch is the data's 8 rows (a batch size past the data is never allocated whole): 64
    // columns of 1 GiB a row make it 512 GiB.
    let gib = FieldDecode::Fixed(FixedSpec { dtype: Dtype::U8, shape: vec![1 << 30] });
    cfg.decode = Some((0..64).fold(DecodeSpec::new(), |d, i| d.with(format!("f{i}"), gib.clone())));
    cfg.batch_size = 1 << 20;
    let err = Loader::new(src.clone(), cfg.clone()).map(|_| ()).unwrap_err();
    assert_eq!(err.kind(), stoker::ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("lower the batch size") && err.to_string().contains("of 8 rows"), "{err}");
    // A batch size past the data is no reason to refuse what the data's rows take.
    cfg.decode =
        Some(DecodeSpec::new().with("f0", FieldDecode::Fixed(FixedSpec { dtype: Dtype::U8, shape: vec![1 << 20] })));
    Loader::new(src, cfg).unwrap();
}

#[test]
fn bad_specs_are_refused_up_front() {
    for (json, want) in [
        (r#"{"jpg": {"kind": "image", "size": [0, 224]}}"#, "size"),
        (r#"{"jpg": {"kind": "image", "normalize": {"mean": [0.5,0.5,0.5], "std": [1,1,1]}}}"#, "float"),
        (r#"{"jpg": {"kind": "image", "flip": 2.0}}"#, "flip"),
        (
            r#"{"jpg": {"kind": "image", "crop": {"mode": "random_resized", "scale": [0.5, 0.1], "ratio": [1, 1]}}}"#,
            "scale",
        ),
        (r#"{"jpg": {"kind": "video"}}"#, "video"),
        (r#"{"jpg": {"kind": "image", "sise": [1, 1]}}"#, "sise"),
        // A declared shape is allocated batch-size times before anything is decoded: one that
        // overflows, or is larger than a sample can be, is refused (it aborted the process).
        (r#"{"e": {"kind": "fixed", "shape": [35184372088832]}}"#, "bytes a sample"),
        (r#"{"e": {"kind": "fixed", "dtype": "float32", "shape": [4611686018427387904, 4]}}"#, "bytes a sample"),
        (r#"{"e": {"kind": "npy", "shape": [1073741824, 2]}}"#, "bytes a sample"),
    ] {
        let err = DecodeSpec::from_json(json).unwrap_err();
        assert!(matches!(err, Error::InvalidOption { .. }) && err.to_string().contains(want), "{json}: {err}");
    }
}

/// The decode memory budget defaults to `max_bytes_in_flight`: a 1500x1500 PNG (working memory
/// about 14 MB) is a decode error naming the option under a 16 MiB budget (a decode may take
/// three quarters of it), and decodes once `decode_memory_bytes` is raised.
#[test]
fn the_decode_memory_budget_follows_max_bytes_in_flight_and_can_be_raised() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut samples = image_shards(dir.path(), 4);
    samples[2].fields[0].data = png(2, 1500, 1500).into();
    write_tar(&dir.path().join("train-000.tar"), &samples);
    let src = rt.block_on(open(dir.path().to_str().unwrap()));
    let mut cfg = LoaderConfig::new(4);
    cfg.decode = Some(spec());
    cfg.max_bytes_in_flight = 16 << 20;
    assert_eq!(cfg.decode_memory(), 16 << 20);
    let err = Loader::new(src.clone(), cfg.clone()).unwrap().epoch_blocking(0).unwrap().next().unwrap().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Decode { index: 2, .. }), "{err:?}");
    assert!(msg.contains("img00002") && msg.contains("1500x1500") && msg.contains("decode_memory_bytes"), "{msg}");
    cfg.decode_memory_bytes = Some(64 << 20);
    let b = Loader::new(src.clone(), cfg.clone()).unwrap().epoch_blocking(0).unwrap().next().unwrap().unwrap();
    assert_eq!(b.len(), 4);
    cfg.decode_memory_bytes = Some(0);
    match Loader::new(src, cfg) {
        Err(err @ Error::InvalidOption { .. }) => assert!(err.to_string().contains("decode_memory_bytes"), "{err}"),
        Err(other) => panic!("{other:?}"),
        Ok(_) => panic!("a zero budget was taken"),
    }
}

#[test]
fn a_part_of_a_source_numbered_from_its_first_index_gives_the_wholes_tensors() {
    let (dir, _samples, src, rt) = setup(48);
    let cfg = |first_index: u64| {
        let mut c = LoaderConfig::new(8);
        c.decode = Some(spec());
        c.augment_seed = 5;
        c.first_index = first_index;
        c
    };
    let whole = images(&Loader::new(src.clone(), cfg(0)).unwrap(), 2, usize::MAX);
    // The part: the last two of the three shards, whose sample 0 is the whole's sample 16 (a
    // Ray read task's part of a listing, opened on its own).
    let part_dir = tempfile::tempdir().unwrap();
    for s in [1, 2] {
        let name = format!("train-{s:03}.tar");
        std::fs::copy(dir.path().join(&name), part_dir.path().join(&name)).unwrap();
    }
    let part = rt.block_on(open(part_dir.path().to_str().unwrap()));
    assert_eq!(part.len(), 32);
    let got = images(&Loader::new(part.clone(), cfg(16)).unwrap(), 2, usize::MAX);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), (16..48).collect::<Vec<u64>>(), "numbered as the whole");
    assert!(got.iter().all(|(i, t)| whole.get(i) == Some(t)), "each sample draws its crop by its index in the whole");
    // Numbered from 0, the same samples draw other crops: the comparison above can fail.
    let own = images(&Loader::new(part, cfg(0)).unwrap(), 2, usize::MAX);
    assert!(own.iter().any(|(i, t)| whole.get(&(i + 16)) != Some(t)));
}
