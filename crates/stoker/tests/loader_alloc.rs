//! Batch storage is recycled: in steady state, assembling a batch allocates nothing, and a
//! whole loader pass allocates far less than the payload it moves. Counted with a global
//! allocator, so this file holds only these tests.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use stoker::batch::BatchPool;
use stoker::loader::{Loader, LoaderConfig};
use stoker::source::{Capability, SampleSource, SourceInfo};
use stoker::{Field, Sample};

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES.fetch_add(l.size() as u64, Relaxed);
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNTING.load(Relaxed) {
            ALLOCS.fetch_add(1, Relaxed);
            BYTES.fetch_add(n as u64, Relaxed);
        }
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Counting is process-wide, so the checks of this file run one after another in one process
/// without libtest (`harness = false`): a second test would allocate while one counts, and so
/// would the harness reporting a finished test or one running past 60 s (on a loaded machine
/// that notice landed inside a window that had to count zero).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn main() {
    // `cargo test NAME` passes its filter here: run unless one is given that does not match.
    let name = "allocations_in_steady_state";
    let filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        println!("{name}: test");
        return;
    }
    allocations_in_steady_state();
    println!("test {name} ... ok");
}

fn allocations_in_steady_state() {
    assembling_a_batch_allocates_nothing_in_steady_state();
    a_loader_pass_allocates_a_small_fraction_of_its_payload();
    decoding_labels_and_arrays_allocates_nothing_in_steady_state();
    // The strict image checks before the slow PNG one.
    decoding_jpegs_allocates_nothing_in_steady_state();
    jpeg_batches_allocate_nothing_in_steady_state();
    resizing_allocates_nothing_in_steady_state();
    decoding_images_allocates_only_inside_the_codecs_and_does_not_grow();
}

fn count<R>(f: impl FnOnce() -> R) -> (R, u64, u64) {
    let (a0, b0) = (ALLOCS.load(Relaxed), BYTES.load(Relaxed));
    COUNTING.store(true, Relaxed);
    let r = f();
    COUNTING.store(false, Relaxed);
    (r, ALLOCS.load(Relaxed) - a0, BYTES.load(Relaxed) - b0)
}

fn samples(n: usize, size: usize) -> Vec<Sample> {
    (0..n)
        .map(|i| Sample {
            key: format!("{i:08}"),
            fields: vec![
                Field { name: "jpg".into(), data: Bytes::from(vec![i as u8; size]) },
                Field { name: "cls".into(), data: Bytes::from(vec![1u8; 4]) },
            ],
        })
        .collect()
}

fn assembling_a_batch_allocates_nothing_in_steady_state() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pool = BatchPool::new(4);
    let batch = samples(64, 65536);
    let idx: Vec<u64> = (0..64).collect();
    for _ in 0..3 {
        drop(pool.assemble(0, 0, &idx, &batch)); // warm up: storage grows to size once
    }
    let ((), allocs, bytes) = count(|| {
        for n in 0..100 {
            let b = pool.assemble(0, n, &idx, &batch);
            assert_eq!(b.len(), 64);
            drop(b);
        }
    });
    assert_eq!((allocs, bytes), (0, 0), "100 batches of 4 MiB assembled with {allocs} allocations ({bytes} bytes)");
}

/// An in-memory source whose samples share their payloads: reading allocates only the small
/// per-sample structures, so what the loader allocates shows.
#[derive(Debug)]
struct Memory(Vec<Sample>);

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("memory")
    }
}

#[async_trait]
impl SampleSource for Memory {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn capability(&self) -> Capability {
        Capability::default()
    }
    fn info(&self) -> SourceInfo {
        // A source of its own: it names its layout rather than claiming one of Stoker's.
        SourceInfo::new("in-memory", 1)
    }
    async fn get(&self, index: usize) -> stoker::Result<Sample> {
        self.0.get(index).cloned().ok_or(stoker::Error::IndexOutOfRange { index, len: self.0.len() })
    }
}

fn a_loader_pass_allocates_a_small_fraction_of_its_payload() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let src: Arc<stoker::DynSampleSource> = Arc::new(Memory(samples(2048, 65536)));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let _guard = rt.enter();
    let loader = Loader::new(src, LoaderConfig::new(64)).unwrap();
    for epoch in 0..2 {
        for b in loader.epoch_blocking(epoch).unwrap() {
            b.unwrap(); // warm up pools and the runtime
        }
    }
    let (payload, _allocs, bytes) = count(|| {
        let mut payload = 0;
        for b in loader.epoch_blocking(2).unwrap() {
            payload += b.unwrap().payload_bytes();
        }
        payload
    });
    assert_eq!(payload, 2048 * (65536 + 4));
    let per_batch = bytes / 32;
    eprintln!("loader pass: {bytes} bytes allocated for {payload} bytes of payload");
    // Allocating payload buffers per batch would cost at least the payload. A loaded machine
    // can keep a few more batches alive at once than the warm-up did, and each of those gets
    // storage once (4 MiB here), so the bound leaves room for several, not for one per batch.
    assert!(
        bytes * 4 < payload,
        "a pass moving {payload} bytes allocated {bytes} bytes ({per_batch} per batch): payload buffers are not recycled"
    );
}

/// A PNG of `w` x `h` (smooth, so it compresses like an image).
fn png(seed: u8, w: u32, h: u32) -> Bytes {
    let px: Vec<u8> = (0..w * h).flat_map(|p| [(p % w) as u8 ^ seed, (p / w) as u8, seed]).collect();
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header().unwrap().write_image_data(&px).unwrap();
    Bytes::from(out)
}

fn decoding_labels_and_arrays_allocates_nothing_in_steady_state() {
    use stoker::decode::{DecodeSpec, Decoder, Dtype, FieldDecode, FixedSpec};
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let batch: Vec<Sample> = (0..64u8)
        .map(|i| Sample {
            key: format!("{i:08}"),
            fields: vec![
                Field { name: "cls".into(), data: Bytes::from(format!(" {i}\n")) },
                Field { name: "emb".into(), data: Bytes::from(vec![i; 512]) },
                Field { name: "txt".into(), data: Bytes::from(vec![b'x'; usize::from(i)]) },
            ],
        })
        .collect();
    let idx: Vec<u64> = (0..64).collect();
    let spec = DecodeSpec::new()
        .with("cls", FieldDecode::Int)
        .with("emb", FieldDecode::Fixed(FixedSpec { dtype: Dtype::F32, shape: vec![128] }));
    let src = Memory(Vec::new());
    for threads in [1, 2] {
        let pool = BatchPool::new(4);
        let decoder = Decoder::new(&spec, 3, threads).unwrap();
        for e in 0..4 {
            drop(decoder.assemble(&pool, &src, e, 0, &idx, &batch, false).unwrap());
        }
        let ((), allocs, bytes) = count(|| {
            for n in 0..100 {
                let (b, _) = decoder.assemble(&pool, &src, 4 + n, n, &idx, &batch, false).unwrap();
                assert_eq!(b.field("emb").unwrap().data.len(), 64 * 512);
                drop(b);
            }
        });
        assert_eq!((allocs, bytes), (0, 0), "{threads} thread(s): 100 decoded batches made {allocs} allocations");
    }
}

/// The image resize on its own (what a decode does after the codec): once its scratch has
/// grown to the largest window seen, RandomResizedCrop windows of any size and shape allocate
/// nothing, whichever pass order and kernel they take.
fn resizing_allocates_nothing_in_steady_state() {
    use stoker::decode::image::resample::{Kernel, Resampler, View};
    use stoker::decode::image::{plan, Window};
    use stoker::decode::{Crop, ImageSpec, SampleRng};
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let spec = ImageSpec { crop: Crop::random_resized(), ..ImageSpec::default() };
    let (w, h) = (500, 375);
    let img: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
    // 64 random windows, each resized twice per kernel: Stoker's kernels run unoptimized in the
    // test profile (each SIMD intrinsic a call), so more would only cost time.
    let windows: Vec<Window> =
        (0..64).map(|i| plan(&spec, w as u32, h as u32, &mut SampleRng::new(1, 0, i)).window).collect();
    let mut out = vec![0u8; 224 * 224 * 3];
    for kernel in [Kernel::Scalar, Kernel::Sse41, Kernel::Avx2].into_iter().filter(|k| k.available()) {
        let mut r = Resampler::with_kernel(kernel).unwrap();
        let mut resize = |r: &mut Resampler, win: &Window| {
            let [l, t, cw, ch] = [win.left, win.top, win.width, win.height].map(|v| v as usize);
            let view = View::new(&img, w, h).unwrap().crop(l, t, cw, ch).unwrap();
            r.resize(view, [0.0, 0.0, cw as f32, ch as f32], &mut out, (224, 224)).unwrap();
        };
        for win in &windows {
            resize(&mut r, win); // warm up: the scratch grows to the largest window
        }
        let ((), allocs, bytes) = count(|| {
            for win in windows.iter().rev() {
                resize(&mut r, win);
            }
        });
        assert_eq!((allocs, bytes), (0, 0), "{kernel:?}: {} warm resizes made {allocs} allocations", windows.len());
    }
}

/// Images: the batch storage, the per-thread scratch (decoded pixels, the resampler's tables
/// and intermediate image) and the decode threads are reused, so what remains per image is
/// what the codecs allocate inside (the PNG reader's inflate state and rows): a fixed amount
/// per image that does not grow over a run. Not zero: the PNG crate takes no caller-owned
/// state. JPEGs allocate nothing (the checks above).
fn decoding_images_allocates_only_inside_the_codecs_and_does_not_grow() {
    use stoker::decode::{Crop, DecodeSpec, Decoder, FieldDecode, ImageSpec};
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let batch: Vec<Sample> = (0..32u8)
        .map(|i| Sample {
            key: format!("{i:08}"),
            fields: vec![
                Field { name: "png".into(), data: png(i, 160 + u32::from(i), 120 + u32::from(i) / 2) },
                Field { name: "cls".into(), data: Bytes::from(format!("{i}")) },
            ],
        })
        .collect();
    let idx: Vec<u64> = (0..32).collect();
    let image = ImageSpec { size: [64, 64], crop: Crop::random_resized(), flip: 0.5, ..ImageSpec::default() };
    let spec = DecodeSpec::new().with("png", FieldDecode::Image(image)).with("cls", FieldDecode::Int);
    let src = Memory(Vec::new());
    let pixels: u64 = (0..32u64).map(|i| (160 + i) * (120 + i / 2) * 3).sum::<u64>() / 32;
    for threads in [1, 2] {
        let pool = BatchPool::new(4);
        let decoder = Decoder::new(&spec, 3, threads).unwrap();
        for e in 0..8 {
            drop(decoder.assemble(&pool, &src, e, 0, &idx, &batch, false).unwrap());
        }
        let mut per_image = Vec::new();
        for round in 0..3u64 {
            let ((), allocs, bytes) = count(|| {
                for n in 0..10 {
                    drop(decoder.assemble(&pool, &src, 8 + round * 10 + n, n, &idx, &batch, false).unwrap());
                }
            });
            per_image.push((allocs / 320, bytes / 320));
        }
        eprintln!("{threads} thread(s): per image (allocations, bytes) over three rounds: {per_image:?}; decoded RGB is {pixels} bytes");
        let (first, last) = (per_image[0], per_image[2]);
        assert!(
            last.0 <= first.0 + 2 && last.1 <= first.1 + 1024,
            "{threads} thread(s): allocations grow: {per_image:?}"
        );
    }
}

/// The JPEG kinds the decoder must handle without allocating once warm: each chroma
/// subsampling our row path takes, the full-decode fallbacks (grayscale, 4:1:1), progressive,
/// restart markers, and EXIF/ICC/XMP segments (skipped, never copied).
#[derive(Clone, Copy, Debug)]
enum JpegKind {
    S420,
    S422,
    S444,
    S440,
    Gray,
    S411,
    Progressive420,
    Progressive444,
    Metadata,
}

const JPEG_KINDS: [JpegKind; 9] = [
    JpegKind::S420,
    JpegKind::S422,
    JpegKind::S444,
    JpegKind::S440,
    JpegKind::Gray,
    JpegKind::S411,
    JpegKind::Progressive420,
    JpegKind::Progressive444,
    JpegKind::Metadata,
];

/// A JPEG of `w` x `h` (a smooth gradient with some texture, so it codes like a photo).
fn jpeg(kind: JpegKind, seed: u8, w: u16, h: u16) -> Bytes {
    use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
    let (wu, hu) = (usize::from(w), usize::from(h));
    let px: Vec<u8> = (0..wu * hu)
        .flat_map(|p| {
            let (x, y) = (p % wu, p / wu);
            [(x * 255 / wu) as u8 ^ seed, (y * 255 / hu) as u8, ((x * y) % 251) as u8]
        })
        .collect();
    let mut out = Vec::new();
    let mut e = Encoder::new(&mut out, 90);
    let sampling = match kind {
        JpegKind::S422 => SamplingFactor::F_2_1,
        JpegKind::S444 | JpegKind::Progressive444 => SamplingFactor::F_1_1,
        JpegKind::S440 => SamplingFactor::F_1_2,
        JpegKind::S411 => SamplingFactor::F_4_1,
        _ => SamplingFactor::F_2_2,
    };
    e.set_sampling_factor(sampling);
    e.set_progressive(matches!(kind, JpegKind::Progressive420 | JpegKind::Progressive444));
    if let JpegKind::Metadata = kind {
        e.set_restart_interval(4);
        e.add_icc_profile(&[7u8; 3000]).unwrap();
        e.add_exif_metadata(&[1u8; 600]).unwrap();
        let mut xmp = b"http://ns.adobe.com/xap/1.0/\0".to_vec();
        xmp.extend_from_slice(&[b'x'; 400]);
        e.add_app_segment(1, xmp).unwrap();
    }
    if let JpegKind::Gray = kind {
        let gray: Vec<u8> = px.chunks_exact(3).map(|c| c[0]).collect();
        e.encode(&gray, w, h, ColorType::Luma).unwrap();
    } else {
        e.encode(&px, w, h, ColorType::Rgb).unwrap();
    }
    Bytes::from(out)
}

/// Every kind in three sizes whose shorter side is 96 (square, landscape, portrait; most not
/// a whole number of blocks). Small, so that the strict checks finish before libtest's 60 s
/// notice (printing it allocates while a check counts).
fn jpeg_batch() -> Vec<Bytes> {
    let mut out = Vec::new();
    for (i, kind) in JPEG_KINDS.into_iter().enumerate() {
        let i16 = i as u16;
        for (j, (w, h)) in [(96 + i16, 96), (144 + i16, 96), (96, 128 + i16)].into_iter().enumerate() {
            out.push(jpeg(kind, (i * 3 + j) as u8, w, h));
        }
    }
    out
}

/// The ImageNet training transform at a small size: RandomResizedCrop(64) and a flip, so
/// every decode resizes a window of a new size and place.
fn train_spec() -> stoker::decode::ImageSpec {
    use stoker::decode::{Crop, ImageSpec};
    ImageSpec { size: [64, 64], crop: Crop::random_resized(), flip: 0.5, ..ImageSpec::default() }
}

/// One decode thread's view: a warm scratch decodes every kind of JPEG, each in a few sizes,
/// without allocating, resize included.
fn decoding_jpegs_allocates_nothing_in_steady_state() {
    use stoker::decode::{decode_image, ImageScratch, SampleRng};
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = jpeg_batch();
    let spec = train_spec();
    let mut scratch = ImageScratch::default();
    let mut out = vec![0u8; spec.out_bytes()];
    for data in &images {
        decode_image(&spec, data, &mut SampleRng::new(0, 0, 0), &mut scratch, &mut out).unwrap();
    }
    let per_image: Vec<(JpegKind, u64, u64)> = images
        .iter()
        .enumerate()
        .map(|(i, data)| {
            let ((), allocs, bytes) = count(|| {
                for n in 0..2 {
                    decode_image(&spec, data, &mut SampleRng::new(1, n, i as u64), &mut scratch, &mut out).unwrap();
                }
            });
            (JPEG_KINDS[i / 3], allocs, bytes)
        })
        .collect();
    eprintln!("two warm JPEG decodes, per image (kind, allocations, bytes): {per_image:?}");
    assert!(per_image.iter().all(|&(_, a, b)| (a, b) == (0, 0)), "warm JPEG decodes allocate: {per_image:?}");
}

/// The same JPEGs through the batch decoder (its decode threads, per-thread scratch, pooled
/// batch storage): zero allocations per batch once warm.
fn jpeg_batches_allocate_nothing_in_steady_state() {
    use stoker::decode::{DecodeSpec, Decoder, FieldDecode};
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let batch: Vec<Sample> = jpeg_batch()
        .into_iter()
        .enumerate()
        .map(|(i, jpg)| Sample {
            key: format!("{i:08}"),
            fields: vec![
                Field { name: "jpg".into(), data: jpg },
                Field { name: "cls".into(), data: Bytes::from(format!("{i}")) },
            ],
        })
        .collect();
    let n = batch.len() as u64;
    let idx: Vec<u64> = (0..n).collect();
    let spec = DecodeSpec::new().with("jpg", FieldDecode::Image(train_spec())).with("cls", FieldDecode::Int);
    let src = Memory(Vec::new());
    for threads in [1, 2] {
        let pool = BatchPool::new(4);
        let decoder = Decoder::new(&spec, 3, threads).unwrap();
        // Rows go to whichever thread claims them first, so with two threads a thread's scratch
        // is warm only once it has met the largest image of each kind, and on a loaded machine
        // one thread can sit out batch after batch and meet one late. Such a thread allocates
        // once; an allocation per batch shows in every window. So: warm up, then up to three
        // windows of six batches, and the steady state is a window without any allocation.
        for epoch in 0..4 {
            drop(decoder.assemble(&pool, &src, epoch, 0, &idx, &batch, false).unwrap());
        }
        let mut windows = Vec::new();
        for w in 0..3u64 {
            let ((), allocs, bytes) = count(|| {
                for k in 0..6 {
                    let (b, _) = decoder.assemble(&pool, &src, 4 + w * 6 + k, k, &idx, &batch, false).unwrap();
                    assert_eq!(b.field("jpg").unwrap().data.len() as u64, n * 64 * 64 * 3);
                    drop(b);
                }
            });
            windows.push((allocs, bytes));
            if allocs == 0 {
                break;
            }
        }
        eprintln!("{threads} thread(s): (allocations, bytes) per window of 6 batches of {n} JPEGs: {windows:?}");
        assert_eq!(
            windows.last(),
            Some(&(0, 0)),
            "{threads} thread(s): every window of 6 batches of {n} JPEGs allocated: {windows:?}"
        );
        if threads == 1 {
            // One thread meets every image in every batch: warm after the warm-up.
            assert_eq!(windows.len(), 1, "one thread allocated after warming up: {windows:?}");
        }
    }
}
