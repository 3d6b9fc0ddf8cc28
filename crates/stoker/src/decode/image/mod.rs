//! Images: sniff the codec, decode (only what the output window needs, where the codec
//! allows), choose the window, resize with antialiasing, flip, convert, write the output.
//!
//! The pixels are torchvision's with the PIL backend: `convert("RGB")` (codec.rs), the window
//! geometry (window.rs), `resize(BILINEAR)` with antialiasing, byte for byte (resample.rs,
//! called from output.rs). For YCbCr JPEGs, jpeg.rs pulls zune-jpeg's raw iMCU rows only down
//! to the window's last row and does libjpeg-turbo's chroma upsampling and colour conversion
//! for the window's pixels alone.
//!
//! Why that JPEG path (single thread, release, ten ImageNet-like 500x375 quality-90 4:2:0
//! photos, RandomResizedCrop(224) + flip; this 2-core machine was shared with another build,
//! so each figure is a range over runs):
//!
//! | option | images/s | vs PIL |
//! |---|---|---|
//! | zune-jpeg 0.5.15 full decode + crop-resize | 460-525 | up to 6 levels, 6% of values off by >1 |
//! | zune-jpeg 0.5.16-rc3 full decode + crop-resize | 500-915 | as 0.5.15 |
//! | jpeg-decoder 0.3.2 full decode + crop-resize | 270-440 | up to 3 levels, 2% off by >1 |
//! | jpeg-decoder with `scale` (DCT downscaling) | 380 | never applies at 224 |
//! | this path (0.5.16-rc3 rows + libjpeg upsampling, plus flip and write) | 480-760 | up to 3 levels, 0.13% off by >1 |
//!
//! Under the load the ranges overlap: this path is about as fast as a full decode (it skips
//! the rows below the window and converts only the window, but its upsampling is scalar Rust
//! where zune-jpeg's is SIMD), and it is chosen for matching PIL. zune-jpeg's raw row pull
//! alone, every row, ran at 625-1060 images/s: that is the ceiling of this design.
//!
//! DCT-domain downscaling needs the window at least twice the output on both axes, which a
//! 224 crop of a 375-pixel-high photo never is, so it buys nothing on ImageNet and is not used.
//!
//! The resize is our own (resample.rs) rather than fast_image_resize: Pillow's exact bytes, no
//! allocation per image, and faster on this workload (RandomResizedCrop(224) windows of
//! 500x375 and 375x500 images, `examples/resize_bench.rs`, one thread, under the same load):
//!
//! | resizer | time per resize, relative | notes |
//! |---|---|---|
//! | fast_image_resize 6.1, AVX2 | 1 (172-234 µs) | 1 level off Pillow on 18% of values; 452 allocations a call |
//! | resample.rs, AVX2 | 0.64-0.82 (137-165 µs) | Pillow's bytes; no allocation |
//! | resample.rs, SSE4.1 | 1.4-1.6 | the same bytes |
//! | resample.rs, portable | 3.0-3.6 | the same bytes |
//!
//! A resize is a tenth or less of a decode, so whole-decode rates move within their noise.

pub(crate) mod blur;
mod codec;
pub(crate) mod color;
mod footprint;
mod jpeg;
mod output;
#[doc(hidden)]
pub mod resample;
pub mod window;

pub use codec::{sniff, Format};
pub use window::{plan, Plan, Window};

use super::budget::{DecodeMemory, OverBudget};
use super::rng::SampleRng;
use super::spec::ImageSpec;

/// Why an image could not be decoded. The loader adds the sample key, field and source.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// Not a format we decode; names what the first bytes look like.
    #[error("unsupported image format ({0}); JPEG, PNG and WebP are decoded")]
    Unsupported(String),
    /// The data ends before the image does.
    #[error("truncated image: {0}")]
    Truncated(String),
    /// The codec refused the data.
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// Width or height is zero.
    #[error("empty image ({width}x{height})")]
    Empty {
        /// Width in pixels.
        width: u64,
        /// Height in pixels.
        height: u64,
    },
    /// More than `max_pixels`, counting the codec's output by its bytes: a pixel of 16-bit
    /// samples or with alpha counts as more than one of 8-bit RGB (a decompression bomb, or a
    /// spec that needs raising).
    #[error("{}", too_large(*width, *height, *pixels, *decoded_bytes, *max))]
    TooLarge {
        /// Width in pixels.
        width: u64,
        /// Height in pixels.
        height: u64,
        /// What counts against `max_pixels`: width × height, or the codec's output in bytes
        /// over 3 where that is more.
        pixels: u64,
        /// The codec's output: width × height × channels × bytes a sample.
        decoded_bytes: u64,
        /// The limit in force.
        max: u64,
    },
    /// Decoding needs more working memory than one decode may take from the decoder's budget.
    #[error(
        "decoding this {width}x{height} image needs about {needed} bytes of working memory, more than the \
         {available} bytes one image may take of the decode memory budget ({limit} bytes, the rest kept by the \
         decode threads): raise decode_memory_bytes (the Loader's option; --decode-memory on the command line), \
         or lower the spec's max_pixels to refuse such images from their header"
    )]
    OverBudget {
        /// Width in pixels.
        width: u64,
        /// Height in pixels.
        height: u64,
        /// Working memory the decode needs, bytes.
        needed: u64,
        /// The most one decode may reserve, bytes.
        available: u64,
        /// The whole budget, bytes.
        limit: u64,
    },
}

fn too_large(width: u64, height: u64, pixels: u64, decoded_bytes: u64, max: u64) -> String {
    let what = if pixels == width * height {
        format!("image of {width}x{height} = {pixels} pixels")
    } else {
        format!(
            "image of {width}x{height} decodes to {decoded_bytes} bytes (16-bit samples or alpha), as much as \
             {pixels} pixels of 8-bit RGB, and"
        )
    };
    format!("{what} exceeds max_pixels={max}; raise the spec's max_pixels to decode it")
}

/// Buffers one thread reuses from image to image, so a warm thread allocates no pixel
/// buffers: all grow to the largest image seen and stay, up to what the thread may keep
/// ([`DecodeMemory::keep`]); after a bigger image they are freed.
#[derive(Default)]
pub struct ImageScratch {
    /// The decoded image (or the part of it the window needs), RGB8.
    pixels: Vec<u8>,
    /// Codec output that is not RGB8 yet (PNG rows, WebP with alpha).
    raw: Vec<u8>,
    /// The resized output window, RGB8, before flip and conversion.
    resized: Vec<u8>,
    /// The JPEG row path's component planes and the JPEG decoder's own buffers.
    jpeg: jpeg::JpegScratch,
    /// The resampler's coefficient tables and intermediate image.
    resampler: resample::Resampler,
    /// The blur's horizontal pass.
    blur: Vec<f32>,
}

impl std::fmt::Debug for ImageScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageScratch")
            .field("pixels", &self.pixels.len())
            .field("raw", &self.raw.len())
            .field("resized", &self.resized.len())
            .field("held_bytes", &self.held_bytes())
            .finish_non_exhaustive()
    }
}

impl ImageScratch {
    /// Bytes the buffers hold between images.
    pub fn held_bytes(&self) -> u64 {
        let ours = self.pixels.capacity() + self.raw.capacity() + self.resized.capacity();
        ours as u64 + self.jpeg.held_bytes() + self.resampler.held_bytes()
    }

    /// Free every buffer.
    pub fn release(&mut self) {
        *self = ImageScratch::default();
    }
}

/// Decode `data` per `spec` into `out` (exactly `spec.out_bytes()` bytes, native-endian
/// elements), drawing the window and flip from `rng` (see [`plan`] for the draws). Without a
/// memory budget: `scratch` keeps what it grew to.
pub fn decode_image(
    spec: &ImageSpec,
    data: &[u8],
    rng: &mut SampleRng,
    scratch: &mut ImageScratch,
    out: &mut [u8],
) -> Result<(), ImageError> {
    static UNLIMITED: DecodeMemory = DecodeMemory::unlimited();
    decode_image_within(&UNLIMITED, spec, data, rng, scratch, out)
}

/// [`decode_image`] within `memory`, shared with other threads: an image whose working memory
/// (from its header) is more than a thread keeps reserves it first, waiting for room, and
/// frees `scratch` before the reservation ends; one needing more than any reservation may hold
/// is [`ImageError::OverBudget`], before its pixels exist.
pub fn decode_image_within(
    memory: &DecodeMemory,
    spec: &ImageSpec,
    data: &[u8],
    rng: &mut SampleRng,
    scratch: &mut ImageScratch,
    out: &mut [u8],
) -> Result<(), ImageError> {
    let format = sniff(data)?;
    let (opened, header) = codec::open(format, data, spec.max_pixels, &mut scratch.jpeg)?;
    let needed = header.working(spec.size);
    let big = needed > memory.keep();
    let reservation = if big {
        match memory.reserve(needed) {
            Ok(r) => Some(r),
            Err(OverBudget { needed, available, limit }) => {
                codec::close(opened, &mut scratch.jpeg);
                let (width, height) = (header.width.into(), header.height.into());
                return Err(ImageError::OverBudget { width, height, needed, available, limit });
            }
        }
    } else {
        None
    };
    let result = decode_opened(spec, data, opened, &header, rng, scratch, out);
    // Before the reservation ends: what this image grew stays counted until it is gone.
    if big || scratch.held_bytes() > memory.keep() {
        scratch.release();
    }
    drop(reservation);
    result
}

fn decode_opened(
    spec: &ImageSpec,
    data: &[u8],
    opened: codec::Opened<'_>,
    header: &footprint::Header,
    rng: &mut SampleRng,
    scratch: &mut ImageScratch,
    out: &mut [u8],
) -> Result<(), ImageError> {
    let (w, h) = (header.width, header.height);
    let plan = plan(spec, w, h, rng);
    let need = window::needed(&plan.window, w, h, spec.size);
    let got = codec::decode_rgb(opened, data, header, need, &mut scratch.pixels, &mut scratch.raw, &mut scratch.jpeg)?;
    // The window relative to what was decoded (all of the image, or just what it needs).
    let win = Window { left: plan.window.left - got.x0 as f64, top: plan.window.top - got.y0 as f64, ..plan.window };
    let got_size = ((got.x1 - got.x0) as u32, (got.y1 - got.y0) as u32);
    let [oh, ow] = spec.size;
    let n = codec::rgb_len(ow, oh)?;
    let resized = grow(&mut scratch.resized, n);
    output::resize(&mut scratch.resampler, &scratch.pixels, got_size, &win, resized, (ow, oh))?;
    // Drawn after the window and flip, so specs without colour keep their crops.
    let ops = color::draw(spec.color_jitter.as_ref(), spec.grayscale, rng);
    color::apply(resized, &ops);
    if let Some(b) = &spec.blur {
        if b.p > 0.0 && rng.unit() < f64::from(b.p) {
            let sigma = rng.uniform(f64::from(b.sigma[0]), f64::from(b.sigma[1])) as f32;
            blur::blur(resized, ow as usize, oh as usize, b.kernel as usize, sigma, &mut scratch.blur);
        }
    }
    output::write(spec, resized, ow as usize, oh as usize, plan.flip, out)
}

/// Grow-only: `buf[..n]`, allocating only when a bigger image than any before comes along.
pub(crate) fn grow(buf: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if buf.len() < n {
        buf.resize(n, 0);
    }
    &mut buf[..n]
}
