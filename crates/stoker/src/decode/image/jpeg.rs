//! YCbCr JPEGs, decoded only as far down as the window needs, then upsampled and converted
//! to RGB exactly as libjpeg-turbo does (what PIL links), for just the window's pixels.
//!
//! zune-jpeg's raw iMCU-row pull (0.5.16) hands over component planes after the IDCT; we stop
//! pulling after the last row the window needs (entropy decoding cannot skip the rows above,
//! but upsampling and colour conversion can) and do libjpeg's "fancy" (triangle) chroma
//! upsampling and its fixed-point YCbCr->RGB ourselves. zune-jpeg's own upsampler differs from
//! libjpeg's by up to 6 levels on 4:2:0 photos; with this one only IDCT rounding remains.
//!
//! Measured on this 2-core machine (shared with another build, so +-15%), single thread,
//! ten ImageNet-like photos (500x375 or 375x500, quality 90, 4:2:0, 16-82 KiB), decode plus
//! RandomResizedCrop(224) plus flip: see the module docs of `super` for the numbers.

use std::sync::OnceLock;

use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::{JpegDecoder, RawImcuRowStatus};

use super::codec::grow;
use super::window::Rect;
use super::ImageError;

/// Planes and row buffers the row path reuses.
#[derive(Default)]
pub struct JpegScratch {
    planes: [Vec<u8>; 3],
    cb_row: Vec<u8>,
    cr_row: Vec<u8>,
    sums: [Vec<i32>; 2],
}

/// Decode `need` of a 3-component YCbCr JPEG with chroma at 1x1 and luma at 1 or 2 on each
/// axis into `pixels` (RGB8, `need.width() x need.height()`). `Ok(false)`: not such a JPEG
/// (gray, CMYK, RGB, odd sampling), decode it whole instead.
pub fn decode_region(
    d: &mut JpegDecoder<ZCursor<&[u8]>>,
    need: Rect,
    js: &mut JpegScratch,
    pixels: &mut Vec<u8>,
    err: fn(zune_jpeg::errors::DecodeErrors) -> ImageError,
) -> Result<bool, ImageError> {
    if d.input_colorspace() != Some(ColorSpace::YCbCr) {
        return Ok(false);
    }
    let mut raw = d.raw_output();
    let (Some(3), Some(layout)) = (raw.num_components(), raw.layout()) else { return Ok(false) };
    let (y, cb, cr) = (layout[0], layout[1], layout[2]);
    let (hf, vf) = (y.horizontal_sampling_factor, y.vertical_sampling_factor);
    let chroma_1x1 = [cb, cr].iter().all(|p| p.horizontal_sampling_factor == 1 && p.vertical_sampling_factor == 1);
    if !chroma_1x1 || !(1..=2).contains(&hf) || !(1..=2).contains(&vf) || y.width < need.x1 || y.height < need.y1 {
        return Ok(false);
    }
    let (cw, ch) = (cb.width, cb.height);
    if cw == 0 || ch == 0 || cr.width != cw || cr.height != ch {
        return Ok(false);
    }
    // Rows to pull: luma to the window's bottom; chroma one row further (the triangle filter's
    // row below), clamped to the plane.
    let luma_rows = need.y1;
    let chroma_rows = ((need.y1 - 1) / vf + 2).min(ch);
    let strides = [y.width, cw, cw];
    let sizes = [y.width * y.height, cw * ch, cw * ch];
    let mut done = [0usize; 3];
    {
        let [p0, p1, p2] = &mut js.planes;
        let (p0, p1, p2) = (grow(p0, sizes[0]), grow(p1, sizes[1]), grow(p2, sizes[2]));
        while done[0] < luma_rows || done[1] < chroma_rows {
            let mut planes: [&mut [u8]; 3] = [
                p0.get_mut(done[0] * strides[0]..).unwrap_or_default(),
                p1.get_mut(done[1] * strides[1]..).unwrap_or_default(),
                p2.get_mut(done[2] * strides[2]..).unwrap_or_default(),
            ];
            match raw.decode_next_imcu_row(&mut planes, &strides).map_err(err)? {
                RawImcuRowStatus::RowReady { rows_written } => {
                    for (d, r) in done.iter_mut().zip(rows_written) {
                        *d += r;
                    }
                }
                RawImcuRowStatus::NeedMoreInput => {
                    return Err(ImageError::Truncated("JPEG: data ends mid-scan".into()))
                }
                _ => break,
            }
        }
    }
    if done[0] < luma_rows || done[1] < chroma_rows || done[2] < chroma_rows {
        return Err(ImageError::Truncated("JPEG: fewer rows than the frame header says".into()));
    }
    drop(raw);
    convert(need, (hf, vf), (y.width, cw, ch), js, pixels);
    Ok(true)
}

/// libjpeg's YCbCr->RGB tables (jdcolor.c, 16-bit fixed point).
struct Tables {
    cr_r: [i32; 256],
    cb_b: [i32; 256],
    cr_g: [i32; 256],
    cb_g: [i32; 256],
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        const ONE_HALF: i64 = 1 << 15;
        let fix = |x: f64| (x * 65536.0 + 0.5) as i64;
        let mut t = Tables { cr_r: [0; 256], cb_b: [0; 256], cr_g: [0; 256], cb_g: [0; 256] };
        for i in 0..256 {
            let x = i as i64 - 128;
            t.cr_r[i] = ((fix(1.40200) * x + ONE_HALF) >> 16) as i32;
            t.cb_b[i] = ((fix(1.77200) * x + ONE_HALF) >> 16) as i32;
            t.cr_g[i] = (-fix(0.71414) * x) as i32;
            t.cb_g[i] = (-fix(0.34414) * x + ONE_HALF) as i32;
        }
        t
    })
}

/// One chroma row of the window at full resolution, upsampled as libjpeg-turbo's
/// `h2v1`/`h1v2`/`h2v2_fancy_upsample` do (edges replicate the nearest sample).
#[allow(clippy::too_many_arguments)]
fn chroma_row(
    plane: &[u8],
    (cw, ch): (usize, usize),
    (hf, vf): (usize, usize),
    row: usize,
    (x0, x1): (usize, usize),
    sums: &mut Vec<i32>,
    out: &mut [u8],
) {
    let at = |r: usize| &plane[r * cw..r * cw + cw];
    let cy = (row / vf).min(ch - 1);
    // Columns of the chroma row that the window reads, one extra each side.
    let (c0, c1) = ((x0 / hf).saturating_sub(1), ((x1 - 1) / hf + 2).min(cw));
    if sums.len() < cw {
        sums.resize(cw, 0);
    }
    let near = at(cy);
    if vf == 2 {
        let far = at(if row.is_multiple_of(2) { cy.saturating_sub(1) } else { (cy + 1).min(ch - 1) });
        for i in c0..c1 {
            sums[i] = 3 * i32::from(near[i]) + i32::from(far[i]);
        }
    } else {
        for i in c0..c1 {
            sums[i] = i32::from(near[i]);
        }
    }
    let s = |i: isize| sums[i.clamp(c0 as isize, c1 as isize - 1) as usize];
    for (x, o) in (x0..x1).zip(out.iter_mut()) {
        let v = match (hf, vf) {
            (1, 1) => sums[x],
            (1, _) => (sums[x] + if row.is_multiple_of(2) { 1 } else { 2 }) >> 2,
            (_, 1) => {
                let i = (x / 2) as isize;
                if x % 2 == 0 {
                    (3 * s(i) + s(i - 1) + 1) >> 2
                } else {
                    (3 * s(i) + s(i + 1) + 2) >> 2
                }
            }
            _ => {
                let i = (x / 2) as isize;
                if x % 2 == 0 {
                    (3 * s(i) + s(i - 1) + 8) >> 4
                } else {
                    (3 * s(i) + s(i + 1) + 7) >> 4
                }
            }
        };
        *o = v as u8;
    }
}

/// Upsample and convert the rows and columns of `need` into `pixels`.
fn convert(
    need: Rect,
    factors: (usize, usize),
    (yw, cw, ch): (usize, usize, usize),
    js: &mut JpegScratch,
    pixels: &mut Vec<u8>,
) {
    let t = tables();
    let width = need.x1 - need.x0;
    let out = grow(pixels, width * (need.y1 - need.y0) * 3);
    let cb_row = grow(&mut js.cb_row, width);
    let cr_row = grow(&mut js.cr_row, width);
    let [yp, cbp, crp] = &js.planes;
    let [s0, s1] = &mut js.sums;
    // Why clamp on the (exact) chroma edge columns: the window's right edge can sit on the
    // last luma column, whose chroma sample has no right neighbour.
    for (row, out_row) in (need.y0..need.y1).zip(out.chunks_exact_mut(width * 3)) {
        chroma_row(cbp, (cw, ch), factors, row, (need.x0, need.x1), s0, cb_row);
        chroma_row(crp, (cw, ch), factors, row, (need.x0, need.x1), s1, cr_row);
        let luma = &yp[row * yw + need.x0..row * yw + need.x1];
        for (((px, &l), &cb), &cr) in out_row.chunks_exact_mut(3).zip(luma).zip(cb_row.iter()).zip(cr_row.iter()) {
            let (l, cb, cr) = (i32::from(l), usize::from(cb), usize::from(cr));
            px[0] = (l + t.cr_r[cr]).clamp(0, 255) as u8;
            px[1] = (l + ((t.cb_g[cb] + t.cr_g[cr]) >> 16)).clamp(0, 255) as u8;
            px[2] = (l + t.cb_b[cb]).clamp(0, 255) as u8;
        }
    }
}
