//! The decode bound: how many images per second one thread turns into training tensors, with
//! nothing else running (no loader, no I/O: the encoded images are read into memory first).
//! Multiplied by the cores, it is the most a decoding pipeline can reach here.
//!
//! ```sh
//! cargo run --release -p stoker-examples --example decode_bound -- SHARDS [FIELD] [SPEC...]
//! cargo run --release -p stoker-examples --example decode_bound -- ./shards jpg image:224:flip
//! ```
//! Prints JSON: images, seconds, images/s for decode + window + resize + flip, and for the
//! codec alone (`squash` at the image's own size is not possible for mixed sizes, so the codec
//! figure decodes and drops the pixels).

use std::time::Instant;

use stoker::decode::{decode_image, DecodeSpec, FieldDecode, ImageScratch, ImageSpec, SampleRng};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let uri = args.first().ok_or("usage: decode_bound SHARDS [FIELD] [SPEC]")?;
    let field = args.get(1).map_or("jpg", String::as_str);
    let spec_arg = format!("{field}={}", args.get(2).map_or("image:224:flip", String::as_str));
    let spec = DecodeSpec::from_args(&[spec_arg])?;
    let Some(FieldDecode::Image(image)) = spec.get(field).cloned() else {
        return Err(format!("{field} is not decoded as an image").into());
    };
    let src = stoker::open(uri, Default::default()).await?;
    let indices: Vec<usize> = (0..src.len()).collect();
    let samples = src.get_many(&indices).await?;
    let images: Vec<bytes::Bytes> = samples.iter().filter_map(|s| s.field(field).cloned()).collect();
    if images.is_empty() {
        return Err(format!("no sample of {src} has a `{field}` field").into());
    }
    let mut scratch = ImageScratch::default();
    let mut out = vec![0u8; image.out_bytes()];
    let full = rate(&images, |i, data| {
        let mut rng = SampleRng::new(0, 0, i as u64);
        decode_image(&image, data, &mut rng, &mut scratch, &mut out).map_err(|e| e.to_string())
    })?;
    // The codec alone: the smallest output and a squash, so resizing costs next to nothing.
    let tiny = ImageSpec { size: [1, 1], crop: stoker::decode::Crop::Squash, flip: 0.0, ..image.clone() };
    let mut one = vec![0u8; tiny.out_bytes()];
    let codec = rate(&images, |i, data| {
        let mut rng = SampleRng::new(0, 0, i as u64);
        decode_image(&tiny, data, &mut rng, &mut scratch, &mut one).map_err(|e| e.to_string())
    })?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{{\"images\": {}, \"spec\": {:?}, \"images_per_s_one_thread\": {full:.1}, \"codec_only_per_s\": {codec:.1}, \
         \"cores\": {cores}, \"bound_images_per_s\": {:.1}}}",
        images.len(),
        args.get(2).map_or("image:224:flip", String::as_str),
        full * cores as f64
    );
    Ok(())
}

/// Images per second over two passes (the first warms the scratch buffers and is not timed).
fn rate(images: &[bytes::Bytes], mut f: impl FnMut(usize, &[u8]) -> Result<(), String>) -> Result<f64, String> {
    for (i, d) in images.iter().enumerate().take(32) {
        f(i, d)?;
    }
    let t = Instant::now();
    let mut n = 0;
    for round in 0..2 {
        for (i, d) in images.iter().enumerate() {
            f(round * images.len() + i, d)?;
            n += 1;
        }
    }
    Ok(n as f64 / t.elapsed().as_secs_f64())
}
