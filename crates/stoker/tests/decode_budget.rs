//! Image decode memory is bounded: by one budget shared by the decode threads, and by
//! `max_pixels` counted in bytes. Measured with a global allocator that keeps the peak of live
//! heap bytes (process-wide, so the tests of this file take turns).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use bytes::Bytes;
use stoker::batch::BatchPool;
use stoker::decode::{
    decode_image, decode_image_within, Crop, DecodeMemory, DecodeSpec, Decoder, FieldDecode, ImageError, ImageScratch,
    ImageSpec, SampleRng,
};
use stoker::{Error, Field, Sample};

struct Peak;
static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static ALLOCATED: AtomicU64 = AtomicU64::new(0);

fn grew(n: usize) {
    let live = LIVE.fetch_add(n as u64, Relaxed) + n as u64;
    PEAK.fetch_max(live, Relaxed);
    ALLOCATED.fetch_add(n as u64, Relaxed);
}

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Peak {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as u64, Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, n) };
        if !q.is_null() {
            // Counted as the new block arriving before the old one leaves: realloc may copy.
            grew(n);
            LIVE.fetch_sub(l.size() as u64, Relaxed);
        }
        q
    }
}

#[global_allocator]
static GLOBAL: Peak = Peak;

static SERIAL: Mutex<()> = Mutex::new(());

/// Run `f` and return its result with the peak of live heap bytes above where they stood at
/// the start, and the bytes allocated meanwhile.
fn heap_peak<R>(f: impl FnOnce() -> R) -> (R, u64, u64) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let allocated = ALLOCATED.load(Relaxed);
    let r = f();
    (r, PEAK.load(Relaxed).saturating_sub(base), ALLOCATED.load(Relaxed) - allocated)
}

const MIB: u64 = 1 << 20;

/// A `w` x `h` 16-bit RGBA PNG of one colour, `rgba`: with the `Up` filter every row after
/// the first is zeros, so megapixels compress to kilobytes, as a decompression bomb does.
fn flat_rgba16_png(w: u32, h: u32, rgba: [u16; 4]) -> Bytes {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, w, h);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Sixteen);
    enc.set_filter(png::Filter::Up);
    enc.set_compression(png::Compression::Fastest);
    let mut writer = enc.write_header().unwrap();
    let mut stream = writer.stream_writer().unwrap();
    let px: Vec<u8> = rgba.iter().flat_map(|c| c.to_be_bytes()).collect();
    let row: Vec<u8> = px.iter().copied().cycle().take(w as usize * 8).collect();
    for _ in 0..h {
        std::io::Write::write_all(&mut stream, &row).unwrap();
    }
    stream.finish().unwrap();
    drop(writer);
    Bytes::from(out)
}

fn sample(i: usize, data: Bytes) -> Sample {
    Sample { key: format!("{i:04}"), fields: vec![Field { name: "image".into(), data }] }
}

#[derive(Debug)]
struct Nowhere;

impl std::fmt::Display for Nowhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("memory")
    }
}

#[async_trait::async_trait]
impl stoker::source::SampleSource for Nowhere {
    fn len(&self) -> usize {
        0
    }
    fn capability(&self) -> stoker::source::Capability {
        stoker::source::Capability::default()
    }
    fn info(&self) -> stoker::source::SourceInfo {
        stoker::source::SourceInfo::new("in-memory", 1)
    }
    async fn get(&self, index: usize) -> stoker::Result<Sample> {
        Err(Error::IndexOutOfRange { index, len: 0 })
    }
}

/// Six huge-but-valid PNGs (2000x2000 16-bit RGBA: 32 MB of codec output and 12 MB of RGB
/// each, about 44 MB of working memory, from 60 KB files) on six decode threads with a budget
/// of 100 MiB: one decodes at a time (a reservation may hold 75 MiB), so the heap stays
/// within the budget, where the threads alone would hold 260 MB. Two 3000x3000 ones in the
/// batch need more than a reservation may hold: each is a `Decode` error naming the option.
#[test]
fn huge_images_on_many_threads_stay_within_the_budget() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let png = flat_rgba16_png(2000, 2000, [0x1234, 0x5678, 0x9abc, 0xffff]);
    let bigger = flat_rgba16_png(3000, 3000, [0x1234, 0x5678, 0x9abc, 0xffff]);
    assert!(png.len() < 200_000 && bigger.len() < 400_000, "{} and {} bytes", png.len(), bigger.len());
    let image = ImageSpec { size: [32, 32], crop: Crop::Squash, max_pixels: 50_000_000, ..ImageSpec::default() };
    let spec = DecodeSpec::new().with("image", FieldDecode::Image(image));
    let budget = 100 * MIB;
    let decoder = Decoder::new(&spec, 0, 6).unwrap().with_memory_budget(budget).unwrap();
    let memory = decoder.memory();
    assert_eq!((memory.limit(), memory.available()), (budget, budget - 7 * (budget / 28)));
    let pool = BatchPool::new(2);
    let good: Vec<Sample> = (0..6).map(|i| sample(i, png.clone())).collect();
    let idx: Vec<u64> = (0..6).collect();

    let (batch, peak, _) = heap_peak(|| decoder.assemble(&pool, &Nowhere, 0, 0, &idx, &good, false).unwrap().0);
    eprintln!("six 2000x2000 RGBA16 PNGs on 6 threads: heap peak {} MiB, budget {} MiB", peak / MIB, budget / MIB);
    let pixels = &batch.field("image").unwrap().data;
    assert_eq!(pixels.len(), 6 * 32 * 32 * 3);
    // PIL keeps the high byte of 16-bit samples; a flat image resizes to itself.
    assert!(pixels.chunks_exact(3).all(|p| p == [0x12, 0x56, 0x9a]), "wrong pixels");
    assert!(peak > 44_000_000, "the images were not decoded whole? peak {peak}");
    assert!(peak <= budget + 4 * MIB, "heap peak {peak} over the budget of {budget}");
    assert!(memory.peak() <= memory.available() && memory.peak() > 44_000_000, "reserved at most {}", memory.peak());
    assert!(memory.waits() > 0, "six threads never had to wait for one another");
    assert_eq!(memory.reserved(), 0);
    drop(batch);

    // Two that cannot fit among them: the batch fails on the first, naming the option; with
    // skip, the others decode and the two are counted.
    let mut mixed = good.clone();
    mixed.insert(2, sample(2, bigger.clone()));
    mixed.push(sample(7, bigger));
    let idx: Vec<u64> = (0..8).collect();
    let (r, peak, _) = heap_peak(|| decoder.assemble(&pool, &Nowhere, 0, 1, &idx, &mixed, false));
    match r {
        Err(Error::Decode { index: 2, key, field, reason, .. }) => {
            assert_eq!((key.as_str(), field.as_str()), ("0002", "image"));
            assert!(reason.contains("3000x3000") && reason.contains("decode_memory_bytes"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(peak <= budget + 4 * MIB, "heap peak {peak} over the budget of {budget}");
    let ((batch, skipped), peak, _) =
        heap_peak(|| decoder.assemble(&pool, &Nowhere, 0, 2, &idx, &mixed, true).unwrap());
    assert_eq!((batch.len(), skipped), (6, 2));
    assert!(batch.field("image").unwrap().data.chunks_exact(3).all(|p| p == [0x12, 0x56, 0x9a]));
    assert!(peak <= budget + 4 * MIB, "heap peak {peak} over the budget of {budget}");
}

/// A thread keeps its scratch for the next image only up to its share: after a big image it
/// is freed, so idle threads do not sit on the memory of the largest image they met.
#[test]
fn scratch_kept_between_images_is_bounded() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let spec = ImageSpec { size: [16, 16], crop: Crop::Squash, ..ImageSpec::default() };
    let memory = DecodeMemory::new(64 * MIB, 1); // keeps up to 16 MiB
    let small = flat_rgba16_png(300, 200, [1, 2, 3, 4]);
    let big = flat_rgba16_png(1500, 1500, [1, 2, 3, 4]); // 18 MB + 6.75 MB
    let mut scratch = ImageScratch::default();
    let mut out = vec![0u8; spec.out_bytes()];
    let mut decode = |data: &[u8], scratch: &mut ImageScratch| {
        decode_image_within(&memory, &spec, data, &mut SampleRng::new(0, 0, 0), scratch, &mut out).unwrap()
    };
    decode(&small, &mut scratch);
    let kept = scratch.held_bytes();
    assert!(kept > 300 * 200 * 3 && kept <= memory.keep(), "{kept}");
    // Warm: the small image reuses what it kept.
    let ((), _, allocated) = heap_peak(|| decode(&small, &mut scratch));
    assert!(allocated < 2 * MIB, "a warm small decode allocated {allocated} bytes");
    decode(&big, &mut scratch);
    assert_eq!(scratch.held_bytes(), 0, "the big image's buffers were kept");
    decode(&small, &mut scratch);
    assert_eq!(scratch.held_bytes(), kept);
    // Without a budget (decode_image alone), a scratch keeps what it grew to.
    let mut out = vec![0u8; spec.out_bytes()];
    decode_image(&spec, &big, &mut SampleRng::new(0, 0, 0), &mut scratch, &mut out).unwrap();
    assert!(scratch.held_bytes() > 1500 * 1500 * 8, "{}", scratch.held_bytes());
}

/// The header of a PNG claiming `w` x `h` pixels of `color` (PNG colour type) at `depth` bits,
/// and nothing after it.
fn png_header(w: u32, h: u32, depth: u8, color: u8) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    v.extend_from_slice(&w.to_be_bytes());
    v.extend_from_slice(&h.to_be_bytes());
    v.extend_from_slice(&[depth, color, 0, 0, 0, 0, 0, 0, 0]); // no valid CRC: never read that far
    v
}

fn decode(spec: &ImageSpec, data: &[u8]) -> Result<(), ImageError> {
    let mut out = vec![0u8; spec.out_bytes()];
    decode_image(spec, data, &mut SampleRng::new(0, 0, 0), &mut ImageScratch::default(), &mut out)
}

/// `max_pixels` counts a pixel by the bytes the codec produces for it: 16-bit RGBA (8 bytes)
/// as 8/3 pixels of 8-bit RGB. A 100-megapixel 16-bit RGBA header passes a pixel count of
/// 200 M but not the byte count, and is refused before anything image-sized is allocated.
#[test]
fn max_pixels_counts_bytes_before_allocating() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let spec = ImageSpec { max_pixels: 200_000_000, ..ImageSpec::default() };
    let (r, peak, _) = heap_peak(|| decode(&spec, &png_header(10_000, 10_000, 16, 6)));
    match r {
        Err(ImageError::TooLarge { pixels: 266_666_667, decoded_bytes: 800_000_000, max: 200_000_000, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(peak < MIB, "refusing the header took {peak} bytes");
    let msg = decode(&spec, &png_header(10_000, 10_000, 16, 6)).unwrap_err().to_string();
    assert!(msg.contains("16-bit samples or alpha") && msg.contains("raise the spec's max_pixels"), "{msg}");
    // 8-bit RGB of the same size passes the check (and fails later, at the header's CRC).
    assert!(matches!(decode(&spec, &png_header(10_000, 10_000, 8, 2)), Err(ImageError::Corrupt(_))));

    // Real images, one per codec, at the edge: exactly max_pixels' worth of bytes decodes.
    let rgba16 = flat_rgba16_png(60, 50, [9, 9, 9, 9]); // 24000 bytes = 8000 RGB pixels
    let webp_rgba = {
        let mut out = Vec::new();
        let px: Vec<u8> = (0..60 * 50).flat_map(|i| [i as u8, 7, 9, (i % 200) as u8]).collect();
        image_webp::WebPEncoder::new(&mut out).encode(&px, 60, 50, image_webp::ColorType::Rgba8).unwrap();
        out // 12000 bytes = 4000 RGB pixels
    };
    let cmyk_jpeg = {
        let mut out = Vec::new();
        let px: Vec<u8> = (0..60 * 50).flat_map(|i| [i as u8, 7, 9, 20]).collect();
        jpeg_encoder::Encoder::new(&mut out, 90).encode(&px, 60, 50, jpeg_encoder::ColorType::Cmyk).unwrap();
        out // four components: 12000 bytes = 4000 RGB pixels
    };
    for (name, data, counted) in
        [("16-bit RGBA PNG", &rgba16[..], 8000), ("RGBA WebP", &webp_rgba, 4000), ("CMYK JPEG", &cmyk_jpeg, 4000)]
    {
        decode(&ImageSpec { max_pixels: counted, ..ImageSpec::default() }, data)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        match decode(&ImageSpec { max_pixels: counted - 1, ..ImageSpec::default() }, data) {
            Err(ImageError::TooLarge { pixels, .. }) => assert_eq!(pixels, counted, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// What a decode reserves (its header's working-memory estimate) covers what it really
/// allocates, codec buffers included, for every codec and kind the decoder takes; and is not
/// far above it (an estimate twice too high would halve what the threads may decode at once).
#[test]
fn the_reservation_covers_what_decoding_allocates() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, h) = (1200u32, 900u32);
    let rgb: Vec<u8> =
        (0..w * h).flat_map(|p| [(p % w) as u8, (p / w) as u8, ((p % w) * (p / w) % 251) as u8]).collect();
    let mut images: Vec<(&str, Vec<u8>)> = Vec::new();
    for (name, sampling, progressive) in [
        ("JPEG 4:2:0", jpeg_encoder::SamplingFactor::F_2_2, false),
        ("JPEG 4:4:4", jpeg_encoder::SamplingFactor::F_1_1, false),
        ("JPEG 4:1:1 (decoded whole)", jpeg_encoder::SamplingFactor::F_4_1, false),
        ("JPEG progressive 4:4:4", jpeg_encoder::SamplingFactor::F_1_1, true),
    ] {
        let mut out = Vec::new();
        let mut e = jpeg_encoder::Encoder::new(&mut out, 90);
        e.set_sampling_factor(sampling);
        e.set_progressive(progressive);
        e.encode(&rgb, w as u16, h as u16, jpeg_encoder::ColorType::Rgb).unwrap();
        images.push((name, out));
    }
    let png = |color: png::ColorType, depth: png::BitDepth, data: &[u8]| {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        if color == png::ColorType::Indexed {
            enc.set_palette((0..=255u8).flat_map(|i| [i, 255 - i, i / 2]).collect::<Vec<u8>>());
            enc.set_trns(vec![128u8; 256]);
        }
        enc.write_header().unwrap().write_image_data(data).unwrap();
        out
    };
    let rgba16: Vec<u8> = rgb.chunks_exact(3).flat_map(|p| [p[0], p[1], p[1], p[2], p[2], p[0], 255, 7]).collect();
    let gray16: Vec<u8> = rgb.chunks_exact(3).flat_map(|p| [p[0], p[1]]).collect();
    let indexed: Vec<u8> = rgb.chunks_exact(3).map(|p| p[0]).collect();
    images.push(("PNG RGB8", png(png::ColorType::Rgb, png::BitDepth::Eight, &rgb)));
    images.push(("PNG RGBA16", png(png::ColorType::Rgba, png::BitDepth::Sixteen, &rgba16)));
    images.push(("PNG gray16", png(png::ColorType::Grayscale, png::BitDepth::Sixteen, &gray16)));
    images.push(("PNG palette + tRNS", png(png::ColorType::Indexed, png::BitDepth::Eight, &indexed)));
    for (name, color, px) in [
        ("WebP lossless", image_webp::ColorType::Rgb8, rgb.clone()),
        ("WebP lossless RGBA", image_webp::ColorType::Rgba8, rgba16.chunks_exact(2).map(|s| s[0]).collect()),
    ] {
        let mut out = Vec::new();
        image_webp::WebPEncoder::new(&mut out).encode(&px, w, h, color).unwrap();
        images.push((name, out));
    }
    for crop in [Crop::Squash, Crop::random_resized()] {
        let spec = ImageSpec { size: [224, 224], crop, ..ImageSpec::default() };
        for (name, data) in &images {
            // A budget nothing fits in answers with what the image needs.
            let tiny = DecodeMemory::new(1, 1);
            let mut out = vec![0u8; spec.out_bytes()];
            let rng = || SampleRng::new(0, 0, 5);
            let needed =
                match decode_image_within(&tiny, &spec, data, &mut rng(), &mut ImageScratch::default(), &mut out) {
                    Err(ImageError::OverBudget { needed, .. }) => needed,
                    other => panic!("{name}: {other:?}"),
                };
            let (r, peak, _) =
                heap_peak(|| decode_image(&spec, data, &mut rng(), &mut ImageScratch::default(), &mut out));
            r.unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!(
                "{name}, {crop:?}: reserves {needed}, allocates at most {peak} ({:.2})",
                needed as f64 / peak as f64
            );
            assert!(peak <= needed, "{name}, {crop:?}: allocated {peak} bytes, reserved {needed}");
            assert!(needed <= 3 * peak, "{name}, {crop:?}: reserved {needed} bytes, allocated {peak}");
        }
    }
}

/// `/proc/self/status` field `name` (e.g. `VmHWM:`, the peak resident set), MiB.
fn status_mib(name: &str) -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// An ImageNet-like JPEG: 500x375 (or 375x500), 4:2:0, quality 90, a gradient with texture.
fn photo(seed: u64) -> Bytes {
    let (w, h): (u16, u16) = if seed.is_multiple_of(3) { (375, 500) } else { (500, 375) };
    let mut rng = SampleRng::new(seed, 0, 0);
    let (wu, hu) = (usize::from(w), usize::from(h));
    let px: Vec<u8> = (0..wu * hu)
        .flat_map(|p| {
            let (x, y) = (p % wu, p / wu);
            let grain = (rng.next_u64() % 24) as usize;
            [
                ((x * 255 / wu + grain) % 256) as u8,
                ((y * 255 / hu + seed as usize) % 256) as u8,
                ((x * y / 7 + grain) % 251) as u8,
            ]
        })
        .collect();
    let mut out = Vec::new();
    jpeg_encoder::Encoder::new(&mut out, 90).encode(&px, w, h, jpeg_encoder::ColorType::Rgb).unwrap();
    Bytes::from(out)
}

/// Measurements for the record, in release, one process per figure:
///
/// ```sh
/// # Peak RSS of N 16-bit RGBA PNGs of MP megapixels on T decode threads, as one batch:
/// STOKER_MEASURE=rss STOKER_IMAGES=6 STOKER_THREADS=6 STOKER_MP=100 [STOKER_DECODE_MEMORY=BYTES] \
///   [STOKER_MAX_PIXELS=N (default: no limit)] \
///   cargo test --release --test decode_budget record -- --ignored --nocapture
/// # Decode rate of ImageNet-like JPEGs (RandomResizedCrop(224) + flip) through the Decoder:
/// STOKER_MEASURE=rate STOKER_THREADS=2 cargo test --release --test decode_budget record -- --ignored --nocapture
/// ```
#[test]
#[ignore = "a measurement: see the doc comment"]
fn record() {
    let var = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let threads = var("STOKER_THREADS", 2) as usize;
    let pool = BatchPool::new(4);
    match std::env::var("STOKER_MEASURE").as_deref() {
        Ok("rss") => {
            let (n, mp) = (var("STOKER_IMAGES", 6) as usize, var("STOKER_MP", 100));
            let side = ((mp * 1_000_000) as f64).sqrt() as u32;
            let png = flat_rgba16_png(side, side, [0x1234, 0x5678, 0x9abc, 0xffff]);
            let image = ImageSpec {
                size: [224, 224],
                crop: Crop::Squash,
                max_pixels: var("STOKER_MAX_PIXELS", 1 << 40),
                ..ImageSpec::default()
            };
            let spec = DecodeSpec::new().with("image", FieldDecode::Image(image));
            let decoder = Decoder::new(&spec, 0, threads).unwrap();
            let decoder = match std::env::var("STOKER_DECODE_MEMORY").ok().and_then(|v| v.parse().ok()) {
                Some(b) => decoder.with_memory_budget(b).unwrap(),
                None => decoder,
            };
            let samples: Vec<Sample> = (0..n).map(|i| sample(i, png.clone())).collect();
            let idx: Vec<u64> = (0..n as u64).collect();
            let before = status_mib("VmHWM:");
            let t = std::time::Instant::now();
            let r = decoder.assemble(&pool, &Nowhere, 0, 0, &idx, &samples, false);
            let secs = t.elapsed().as_secs_f64();
            let result = match &r {
                Ok((b, _)) if b.field("image").unwrap().data.chunks_exact(3).all(|p| p == [0x12, 0x56, 0x9a]) => {
                    format!("all {n} decoded right")
                }
                Ok(_) => "decoded WRONG".to_string(),
                Err(e) => format!("error: {e}"),
            };
            println!(
                "{{\"images\": {n}, \"side\": {side}, \"png_bytes\": {}, \"threads\": {threads}, \"seconds\": {secs:.2}, \
                 \"vmhwm_before_mib\": {before:.0}, \"vmhwm_mib\": {:.0}, \"result\": {result:?}}}",
                png.len(),
                status_mib("VmHWM:")
            );
        }
        Ok("rate") => {
            let photos: Vec<Sample> = (0..256).map(|i| sample(i as usize, photo(i))).collect();
            let image = ImageSpec { crop: Crop::random_resized(), flip: 0.5, ..ImageSpec::default() };
            let spec = DecodeSpec::new().with("image", FieldDecode::Image(image));
            let decoder = Decoder::new(&spec, 0, threads).unwrap();
            let batches: Vec<(Vec<u64>, &[Sample])> = photos
                .chunks(64)
                .enumerate()
                .map(|(b, s)| (((b * 64) as u64..(b * 64 + s.len()) as u64).collect(), s))
                .collect();
            let run = |epoch: u64| {
                for (n, (idx, s)) in batches.iter().enumerate() {
                    drop(decoder.assemble(&pool, &Nowhere, epoch, n as u64, idx, s, false).unwrap());
                }
            };
            run(0);
            let rounds = var("STOKER_ROUNDS", 8);
            let t = std::time::Instant::now();
            for e in 1..=rounds {
                run(e);
            }
            let rate = (rounds * 256) as f64 / t.elapsed().as_secs_f64();
            println!("{{\"threads\": {threads}, \"images\": {}, \"images_per_s\": {rate:.1}}}", rounds * 256);
        }
        _ => eprintln!("skipped: set STOKER_MEASURE=rss or rate (see the doc comment)"),
    }
}
