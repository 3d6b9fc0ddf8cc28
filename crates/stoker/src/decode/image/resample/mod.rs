//! Pillow's antialiased bilinear resize, bit for bit: `Image.resize(size, BILINEAR, box)` on
//! 8-bit RGB as Pillow 13's libImaging/Resample.c computes it, with SIMD loops and no
//! allocation once the scratch has grown.
//!
//! Why our own: torchvision's PIL backend is the reference our tensors are compared with, and
//! a general-purpose resizer (fast_image_resize) rounds its 16-bit coefficients differently
//! (up to a level off) and allocates hundreds of small vectors per call.
//!
//! What must match Pillow, and does here:
//! - the filter: a triangle of support `max(scale, 1)` source pixels around each output
//!   pixel's centre `in0 + (x + 0.5) * scale`, its taps rounded to the nearest pixel, the
//!   weights divided by their sum, all in `f64`, from an `f32` box (Pillow parses the box as
//!   C floats, so `in1 - in0` is an `f32` subtraction);
//! - the integers: weights as `i32` with 22 fractional bits rounded half away from zero,
//!   accumulators starting at half an output level, `>> 22` and a clamp to 0..=255;
//! - the order of the passes, since each rounds to 8 bits: horizontal first over only the
//!   rows the vertical pass reads, unless the height shrinks by more than twice what the width
//!   does (then vertical first), and a pass is skipped when it would be the identity;
//! - a box of whole pixels as large as the output is a plain copy.
//!
//! The SIMD loops (x86.rs) compute the same integer sums in another order (integer addition
//! is associative, and the sums stay far below `i32::MAX`), so every kernel gives the same
//! bytes; tests check it.

#[cfg(target_arch = "x86_64")]
mod x86;

use super::{grow, ImageError};

/// Fractional bits of the fixed-point weights (Pillow's `PRECISION_BITS`, 32 - 8 - 2).
const PRECISION_BITS: u32 = 22;
/// What every accumulator starts from: half an output level, so the shift rounds.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// The loops that run the two passes. All give identical bytes; they differ in speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust (what non-x86 CPUs run).
    Scalar,
    /// x86-64 with SSE4.1.
    Sse41,
    /// x86-64 with AVX2.
    Avx2,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn detect() -> Kernel {
        [Kernel::Avx2, Kernel::Sse41].into_iter().find(|k| k.available()).unwrap_or(Kernel::Scalar)
    }

    /// Whether this CPU can run the kernel.
    pub fn available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Sse41 => std::is_x86_feature_detected!("sse4.1"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => std::is_x86_feature_detected!("avx2"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// An RGB8 image inside a byte buffer: `width` x `height` pixels whose rows start `stride`
/// bytes apart, the first at `offset`. A crop of a larger image is a view with an offset.
#[derive(Clone, Copy)]
pub struct View<'a> {
    data: &'a [u8],
    offset: usize,
    width: usize,
    height: usize,
    stride: usize,
}

impl std::fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("bytes", &self.data.len())
            .field("offset", &self.offset)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("stride", &self.stride)
            .finish()
    }
}

fn bad(what: impl std::fmt::Display) -> ImageError {
    ImageError::Corrupt(format!("resize: {what}"))
}

impl<'a> View<'a> {
    /// The packed RGB8 image `data` of `width` x `height` pixels (rows `3 * width` bytes).
    pub fn new(data: &'a [u8], width: usize, height: usize) -> Result<Self, ImageError> {
        let stride = width.checked_mul(3).ok_or_else(|| bad("image too wide"))?;
        View { data, offset: 0, width, height, stride }.checked()
    }

    /// The `width` x `height` pixels from (`x`, `y`), as `img.crop((x, y, x + w, y + h))`.
    pub fn crop(self, x: usize, y: usize, width: usize, height: usize) -> Result<Self, ImageError> {
        if x.checked_add(width).is_none_or(|r| r > self.width) || y.checked_add(height).is_none_or(|b| b > self.height)
        {
            return Err(bad(format_args!(
                "crop {width}x{height} at ({x}, {y}) of a {}x{} image",
                self.width, self.height
            )));
        }
        let offset = self.offset + y * self.stride + x * 3;
        View { offset, width, height, ..self }.checked()
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The view, if it is non-empty and every pixel it names lies inside `data`; the unsafe
    /// loops rely on this.
    fn checked(self) -> Result<Self, ImageError> {
        let end = (self.height.max(1) - 1)
            .checked_mul(self.stride)
            .and_then(|r| r.checked_add(self.width.checked_mul(3)?))
            .and_then(|r| r.checked_add(self.offset));
        if self.width == 0 || self.height == 0 {
            return Err(bad(format_args!("empty {}x{} image", self.width, self.height)));
        }
        if self.stride < self.width * 3 || end.is_none_or(|e| e > self.data.len()) {
            return Err(bad(format_args!("{self:?} does not fit its buffer")));
        }
        Ok(self)
    }

    /// Rows `y0..y0 + n` (already checked to exist).
    fn rows(self, y0: usize, n: usize) -> Self {
        View { offset: self.offset + y0 * self.stride, height: n, ..self }
    }

    fn row(&self, y: usize) -> &'a [u8] {
        &self.data[self.offset + y * self.stride..][..self.width * 3]
    }
}

/// The filter along one axis: for each output pixel the first source pixel and the tap
/// count, and `ksize` fixed-point weights (Pillow's `precompute_coeffs` and
/// `normalize_coeffs_8bpc`). Every buffer grows to the largest resize seen and is reused.
#[derive(Default)]
struct Axis {
    ksize: usize,
    /// `(first source pixel, taps)` per output pixel.
    bounds: Vec<(usize, usize)>,
    /// `ksize` weights per output pixel, the first `taps` of them used.
    k: Vec<i32>,
    /// One output pixel's weights before they become integers.
    w: Vec<f64>,
    /// The SIMD horizontal loops' layout: per output pixel `ksize.div_ceil(2)` entries, each
    /// two taps' weights spread over an RGB pixel pair as loaded from memory
    /// (`[k0, k0, k0, k1, k1, k1, 0, 0]` against bytes `r0 g0 b0 r1 g1 b1 r2 g2`).
    pairs: Vec<[i32; 8]>,
    /// How many bytes past a row's start the SIMD horizontal loads reach: they read 8 bytes
    /// for each pair of taps, up to 2 past the last pixel used.
    read_end: usize,
}

impl Axis {
    /// Pillow's `precompute_coeffs` for the bilinear filter, then `normalize_coeffs_8bpc`:
    /// `out` pixels from the source span `in0..in1` of an axis of `in_size` pixels.
    fn precompute(&mut self, in_size: usize, in0: f32, in1: f32, out: usize) -> Result<(), ImageError> {
        let scale = f64::from(in1 - in0) / out as f64;
        let filterscale = if scale < 1.0 { 1.0 } else { scale };
        let support = filterscale; // the bilinear filter's support is 1
        let ksize = support.ceil() as usize * 2 + 1;
        let total = ksize.checked_mul(out).filter(|&n| n <= 1 << 31).ok_or_else(|| bad("filter too large"))?;
        self.ksize = ksize;
        self.bounds.clear();
        self.k.clear();
        self.k.resize(total, 0);
        self.w.clear();
        self.w.resize(ksize, 0.0);
        let inv_filterscale = 1.0 / filterscale;
        for (xx, k) in self.k.chunks_exact_mut(ksize).enumerate() {
            let center = f64::from(in0) + (xx as f64 + 0.5) * scale;
            // C's (int) truncates toward zero; these are in range for any valid box.
            let xmin = ((center - support + 0.5) as i64).clamp(0, in_size as i64);
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64);
            let taps = (xmax - xmin).clamp(0, ksize as i64) as usize;
            let mut ww = 0.0;
            for (x, w) in self.w[..taps].iter_mut().enumerate() {
                *w = bilinear(((x as i64 + xmin) as f64 - center + 0.5) * inv_filterscale);
                ww += *w;
            }
            for (k, &w) in k.iter_mut().zip(&self.w[..taps]) {
                let w = if ww != 0.0 { w / ww } else { w };
                let scaled = w * f64::from(1u32 << PRECISION_BITS);
                *k = if w < 0.0 { (-0.5 + scaled) as i32 } else { (0.5 + scaled) as i32 };
            }
            self.bounds.push((xmin as usize, taps));
        }
        Ok(())
    }

    /// The first source pixel any output pixel reads, and one past the last.
    fn span(&self) -> (usize, usize) {
        let first = self.bounds.first().map_or(0, |b| b.0);
        let last = self.bounds.iter().map(|&(x, n)| x + n).max().unwrap_or(first);
        (first, last)
    }

    /// Make source pixel `by` index 0 (the pass reads a buffer that starts there).
    fn shift(&mut self, by: usize) {
        for b in &mut self.bounds {
            b.0 -= by;
        }
    }

    /// Fill `pairs` and `read_end` for the SIMD horizontal loops.
    fn prepare_pairs(&mut self) {
        let per = self.ksize.div_ceil(2);
        self.pairs.clear();
        self.pairs.resize(self.bounds.len() * per, [0; 8]);
        self.read_end = 0;
        for (xx, (&(first, taps), out)) in self.bounds.iter().zip(self.pairs.chunks_exact_mut(per)).enumerate() {
            let k = &self.k[xx * self.ksize..][..taps];
            for (pair, o) in k.chunks(2).zip(out.iter_mut()) {
                let (k0, k1) = (pair[0], pair.get(1).copied().unwrap_or(0));
                *o = [k0, k0, k0, k1, k1, k1, 0, 0];
            }
            if taps > 0 {
                self.read_end = self.read_end.max(first * 3 + 6 * taps.div_ceil(2) + 2);
            }
        }
    }

    fn taps(&self, i: usize) -> (usize, &[i32]) {
        let (first, n) = self.bounds[i];
        (first, &self.k[i * self.ksize..][..n])
    }
}

/// Pillow's `bilinear_filter`: a triangle of half-width 1.
fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// Pillow's `clip8`: the accumulator's integer part, clamped to a byte.
#[inline(always)]
fn clip8(ss: i32) -> u8 {
    (ss >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Pillow's bilinear resize with its scratch: coefficient tables, the intermediate image and
/// a padded row, all kept from call to call, so a warm resampler allocates nothing.
pub struct Resampler {
    kernel: Kernel,
    horiz: Axis,
    vert: Axis,
    /// The image between the passes.
    tmp: Vec<u8>,
    /// A source row copied with slack after it, for the SIMD loads that would read past the
    /// end of the source buffer on its last rows.
    pad: Vec<u8>,
}

impl Default for Resampler {
    fn default() -> Self {
        Resampler::with_kernel(Kernel::detect()).unwrap_or_else(|| Resampler::new_unchecked(Kernel::Scalar))
    }
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler").field("kernel", &self.kernel).field("tmp", &self.tmp.capacity()).finish()
    }
}

impl Resampler {
    /// A resampler running the fastest kernel this CPU has.
    pub fn new() -> Self {
        Self::default()
    }

    /// A resampler running `kernel`, if this CPU can.
    pub fn with_kernel(kernel: Kernel) -> Option<Self> {
        kernel.available().then(|| Self::new_unchecked(kernel))
    }

    fn new_unchecked(kernel: Kernel) -> Self {
        Resampler { kernel, horiz: Axis::default(), vert: Axis::default(), tmp: Vec::new(), pad: Vec::new() }
    }

    /// The kernel in use.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Bytes its scratch holds (what a decode thread keeps between images).
    pub fn held_bytes(&self) -> u64 {
        let axis =
            |a: &Axis| a.bounds.capacity() * 16 + a.k.capacity() * 4 + a.w.capacity() * 8 + a.pairs.capacity() * 32;
        (self.tmp.capacity() + self.pad.capacity() + axis(&self.horiz) + axis(&self.vert)) as u64
    }

    /// `img.resize((dw, dh), Image.BILINEAR, box=bx)` where `img` is `src`, into `dst`
    /// (packed RGB8, `dw * dh * 3` bytes). `bx` is `(left, top, right, bottom)` in source
    /// pixels, as the `f32`s Pillow parses it into; it must lie inside the image.
    pub fn resize(
        &mut self,
        src: View<'_>,
        bx: [f32; 4],
        dst: &mut [u8],
        (dw, dh): (usize, usize),
    ) -> Result<(), ImageError> {
        let (w, h) = (src.width, src.height);
        let n = dw.checked_mul(dh).and_then(|p| p.checked_mul(3));
        if dw == 0 || dh == 0 || n != Some(dst.len()) {
            return Err(bad(format_args!("{} bytes for a {dw}x{dh} output", dst.len())));
        }
        // Pillow's own checks (_imaging.c `_resize`), plus NaN.
        let [x0, y0, x1, y1] = bx;
        if bx.iter().any(|v| !v.is_finite())
            || x0 < 0.0
            || y0 < 0.0
            || x1 > w as f32
            || y1 > h as f32
            || x1 - x0 < 0.0
            || y1 - y0 < 0.0
        {
            return Err(bad(format_args!("box {bx:?} outside the {w}x{h} image")));
        }
        // A box of whole pixels the size of the output is a crop (Pillow copies it).
        if x0.fract() == 0.0 && x1 - x0 == dw as f32 && y0.fract() == 0.0 && y1 - y0 == dh as f32 {
            let cut = src.crop(x0 as usize, y0 as usize, dw, dh)?;
            for (y, out) in dst.chunks_exact_mut(dw * 3).enumerate() {
                out.copy_from_slice(cut.row(y));
            }
            return Ok(());
        }
        let need_h = dw != w || x0 != 0.0 || x1 != dw as f32;
        let need_v = dh != h || y0 != 0.0 || y1 != dh as f32;
        let (wi, hi, dwi, dhi) = (w as i64, h as i64, dw as i64, dh as i64);
        let vertical_first = hi - dhi > 0 && hi - dhi > (wi - dwi) * 2;
        let Resampler { kernel, horiz, vert, tmp, pad } = self;
        let kernel = *kernel;
        if need_v {
            vert.precompute(h, y0, y1, dh)?;
        }
        if need_h {
            horiz.precompute(w, x0, x1, dw)?;
        }
        match (need_h, need_v) {
            (false, false) => {
                for (y, out) in dst.chunks_exact_mut(dw * 3).enumerate() {
                    out.copy_from_slice(src.row(y));
                }
                Ok(())
            }
            (true, false) => {
                // Pillow's vertical filter is the identity here: it reads rows 0..h.
                horizontal(kernel, horiz, pad, src, dst)
            }
            (false, true) => vertical(kernel, vert, src, 0, dst),
            (true, true) if !vertical_first => {
                // Only the rows the vertical pass reads.
                let (first, last) = vert.span();
                vert.shift(first);
                let rows = src.rows(first, last - first);
                let mid = grow(tmp, dw * 3 * rows.height);
                horizontal(kernel, horiz, pad, rows, mid)?;
                vertical(kernel, vert, View::new(mid, dw, rows.height)?, 0, dst)
            }
            (true, true) => {
                // Pillow filters every column here; only those the horizontal pass reads
                // matter, and each column's result does not depend on the others.
                let (first, last) = horiz.span();
                horiz.shift(first);
                let cols = last - first;
                let mid = grow(tmp, cols * 3 * dh);
                vertical(kernel, vert, src, first, mid)?;
                horizontal(kernel, horiz, pad, View::new(mid, cols, dh)?, dst)
            }
        }
    }
}

/// The horizontal pass: every row of `src` filtered by `axis` into the packed rows of `dst`.
fn horizontal(
    kernel: Kernel,
    axis: &mut Axis,
    pad: &mut Vec<u8>,
    src: View<'_>,
    dst: &mut [u8],
) -> Result<(), ImageError> {
    let out_row = axis.bounds.len() * 3;
    let (_, last) = axis.span();
    if last > src.width || dst.len() != out_row * src.height {
        return Err(bad("horizontal pass out of bounds"));
    }
    if kernel == Kernel::Scalar {
        for (y, out) in dst.chunks_exact_mut(out_row).enumerate() {
            h_row_scalar(src.row(y), axis, out);
        }
        return Ok(());
    }
    axis.prepare_pairs();
    let done = four_rows_at_a_time(kernel, axis, src, dst);
    for (y, out) in dst.chunks_exact_mut(out_row).enumerate().skip(done) {
        let start = src.offset + y * src.stride;
        let row = if start + axis.read_end <= src.data.len() {
            &src.data[start..start + axis.read_end]
        } else {
            // The loads would run off the buffer (its last rows): copy the row with slack.
            let avail = (src.data.len() - start).min(axis.read_end);
            let padded = grow(pad, axis.read_end);
            padded[..avail].copy_from_slice(&src.data[start..start + avail]);
            padded[avail..].fill(0);
            &*padded
        };
        h_row_simd(kernel, row, axis, out);
    }
    Ok(())
}

/// The leading rows of `src` that the AVX2 kernel can take four at a time, filtered into
/// `dst`; returns how many it did. Four rows share the weights' loads and the loop's
/// bookkeeping, and their reductions pack together; rows whose loads would run off the
/// buffer are left to the one-row loop.
#[cfg(target_arch = "x86_64")]
fn four_rows_at_a_time(kernel: Kernel, axis: &Axis, src: View<'_>, dst: &mut [u8]) -> usize {
    if kernel != Kernel::Avx2 {
        return 0;
    }
    let out_row = axis.bounds.len() * 3;
    let fits = |y: usize| src.offset + y * src.stride + axis.read_end <= src.data.len();
    let mut done = 0;
    while done + 4 <= src.height && fits(done + 3) {
        let rows = [0, 1, 2, 3].map(|i| &src.data[src.offset + (done + i) * src.stride..][..axis.read_end]);
        let (o0, rest) = dst[done * out_row..(done + 4) * out_row].split_at_mut(out_row);
        let (o1, rest) = rest.split_at_mut(out_row);
        let (o2, o3) = rest.split_at_mut(out_row);
        // SAFETY: the CPU has AVX2 (`with_kernel`); each row holds `read_end` bytes, the
        // furthest any load reaches (prepare_pairs), and each output row every output.
        unsafe { x86::h_rows4_avx2(rows, axis, [o0, o1, o2, o3]) };
        done += 4;
    }
    done
}

#[cfg(not(target_arch = "x86_64"))]
fn four_rows_at_a_time(_: Kernel, _: &Axis, _: View<'_>, _: &mut [u8]) -> usize {
    0
}

/// One row through a SIMD kernel. `row` holds at least `axis.read_end` bytes.
fn h_row_simd(kernel: Kernel, row: &[u8], axis: &Axis, out: &mut [u8]) {
    debug_assert!(row.len() >= axis.read_end && out.len() == axis.bounds.len() * 3);
    match kernel {
        Kernel::Scalar => h_row_scalar(row, axis, out),
        // SAFETY: the kernel was chosen because the CPU has the feature (`with_kernel`);
        // `row` holds `read_end` bytes, which `prepare_pairs` computed from these bounds as
        // the furthest any load reaches, and `horizontal` checked `out` holds every output.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => unsafe { x86::h_row_avx2(row, axis, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Kernel::Sse41 => unsafe { x86::h_row_sse41(row, axis, out) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => h_row_scalar(row, axis, out),
    }
}

/// Pillow's `ImagingResampleHorizontal_8bpc` for one RGB row.
fn h_row_scalar(row: &[u8], axis: &Axis, out: &mut [u8]) {
    for (xx, o) in out.chunks_exact_mut(3).enumerate() {
        let (first, k) = axis.taps(xx);
        let px = &row[first * 3..(first + k.len()) * 3];
        let mut ss = [HALF; 3];
        for (p, &kv) in px.chunks_exact(3).zip(k) {
            for c in 0..3 {
                // Wrapping as C's int does on the (unreachable here) overflow, never a panic.
                ss[c] = ss[c].wrapping_add(i32::from(p[c]).wrapping_mul(kv));
            }
        }
        for c in 0..3 {
            o[c] = clip8(ss[c]);
        }
    }
}

/// The vertical pass: columns `col0..col0 + dst row width` of `src` filtered by `axis` into
/// the packed rows of `dst`, one per output row.
fn vertical(kernel: Kernel, axis: &Axis, src: View<'_>, col0: usize, dst: &mut [u8]) -> Result<(), ImageError> {
    let rows = axis.bounds.len();
    if rows == 0 || !dst.len().is_multiple_of(rows) {
        return Err(bad("vertical pass out of bounds"));
    }
    let width = dst.len() / rows;
    let (_, last) = axis.span();
    if last > src.height || !width.is_multiple_of(3) || col0 + width / 3 > src.width {
        return Err(bad("vertical pass out of bounds"));
    }
    for (yy, out) in dst.chunks_exact_mut(width).enumerate() {
        let (first, k) = axis.taps(yy);
        let base = src.offset + first * src.stride + col0 * 3;
        match kernel {
            Kernel::Scalar => v_row_scalar(src.data, base, src.stride, k, out),
            // SAFETY: the CPU has the feature (`with_kernel`); rows `first..first + taps` of
            // `src` exist (checked above against the view, which `View::checked` keeps inside
            // its buffer), and columns `col0..col0 + width / 3` lie inside each row.
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { x86::v_row_avx2(src.data, base, src.stride, k, out) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Kernel::Sse41 => unsafe { x86::v_row_sse41(src.data, base, src.stride, k, out) },
            #[cfg(not(target_arch = "x86_64"))]
            _ => v_row_scalar(src.data, base, src.stride, k, out),
        }
    }
    Ok(())
}

/// Pillow's `ImagingResampleVertical_8bpc` for one output row of `out.len()` bytes: taps
/// `k` over the rows starting at `base`, `stride` apart. Taps outermost over a block of
/// accumulators, so the compiler vectorises it on any CPU.
fn v_row_scalar(data: &[u8], base: usize, stride: usize, k: &[i32], out: &mut [u8]) {
    const BLOCK: usize = 256;
    for (b, o) in out.chunks_mut(BLOCK).enumerate() {
        let mut acc = [HALF; BLOCK];
        let acc = &mut acc[..o.len()];
        for (t, &kv) in k.iter().enumerate() {
            let row = &data[base + t * stride + b * BLOCK..][..o.len()];
            for (a, &p) in acc.iter_mut().zip(row) {
                *a = a.wrapping_add(i32::from(p).wrapping_mul(kv));
            }
        }
        for (o, &a) in o.iter_mut().zip(acc.iter()) {
            *o = clip8(a);
        }
    }
}

#[cfg(test)]
mod tests;
