//! The declarative per-field decode spec (serde, so Python and the CLI hand it over as JSON).

use serde::{Deserialize, Serialize};

pub use super::tokens::{TokenRef, TokensSpec};
use crate::error::{Error, Result};

/// What to turn one field into. Fields not named in a [`DecodeSpec`] stay raw bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum FieldDecode {
    /// An encoded image (JPEG, PNG, WebP) to a fixed-size RGB tensor.
    Image(ImageSpec),
    /// ASCII integer text (`.cls`, `.txt`: `"7"`, `" 12\n"`) to one `int64`.
    Int,
    /// A `.npy` array; all samples of the run share the first one's dtype and shape (or the
    /// declared ones), so the batch is one stacked array `[B, *shape]`.
    Npy(NpySpec),
    /// Kept as bytes: `(data, offsets)` in Python, whatever the lengths.
    Bytes,
    /// Raw bytes of a declared fixed size, read as one `dtype` array of `shape` (native byte
    /// order): a dense `[B, *shape]` column. A value of another length is an error.
    Fixed(FixedSpec),
    /// UTF-8 text tokenized, one document per row: `[B, seq_len]` ids and a `FIELD_len`
    /// column of lengths ([`TokensSpec`]).
    Tokens(TokensSpec),
}

/// A raw field declared fixed-width.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedSpec {
    /// Element type (`uint8` for plain bytes).
    #[serde(default = "uint8")]
    pub dtype: Dtype,
    /// Shape of one value.
    pub shape: Vec<usize>,
}

fn uint8() -> Dtype {
    Dtype::U8
}

/// Image decode and augmentation, torchvision's ImageNet transforms in one fused step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageSpec {
    /// Output `[height, width]`.
    pub size: [u32; 2],
    /// How the output window is chosen.
    pub crop: Crop,
    /// Probability of a horizontal flip (0 never, 1 always).
    pub flip: f32,
    /// Channel order of the output: `[H, W, 3]` or `[3, H, W]`.
    pub layout: ImageLayout,
    /// Element type of the output. `uint8` keeps 0..=255; float types are scaled to 0..=1 and,
    /// with `normalize`, standardised.
    pub dtype: Dtype,
    /// `(x / 255 - mean) / std` per channel (torchvision's `Normalize` after `ToTensor`);
    /// needs a float `dtype`.
    pub normalize: Option<Normalize>,
    /// Images with more pixels than this are refused (decompression bombs).
    pub max_pixels: u64,
    /// torchvision's `ColorJitter`, after the resize and before the flip and conversion.
    pub color_jitter: Option<ColorJitter>,
    /// torchvision's `RandomGrayscale(p)`: the probability (0 never), after the jitter.
    pub grayscale: f32,
    /// torchvision's `GaussianBlur(kernel, sigma)`, after the colour operations.
    pub blur: Option<Blur>,
}

/// torchvision's `GaussianBlur(kernel_size, sigma=(lo, hi))`, applied with probability `p`
/// (`RandomApply([GaussianBlur(...)], p)`; Albumentations' `GaussianBlur(blur_limit, sigma_limit, p)`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Blur {
    /// Taps of the kernel, odd, at least 3.
    pub kernel: u32,
    /// `sigma` drawn uniformly from `[lo, hi]` per sample.
    pub sigma: [f32; 2],
    /// Probability of blurring a sample.
    pub p: f32,
}

impl Default for ImageSpec {
    fn default() -> Self {
        ImageSpec {
            size: [224, 224],
            crop: Crop::Center { resize: None },
            flip: 0.0,
            layout: ImageLayout::Hwc,
            dtype: Dtype::U8,
            normalize: None,
            max_pixels: 100_000_000,
            color_jitter: None,
            grayscale: 0.0,
            blur: None,
        }
    }
}

/// torchvision's `ColorJitter(brightness, contrast, saturation, hue)`: each a non-negative
/// amount (hue at most 0.5); 0 leaves that operation out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ColorJitter {
    /// Factor drawn from `[max(0, 1 - brightness), 1 + brightness]`.
    pub brightness: f32,
    /// Factor drawn from `[max(0, 1 - contrast), 1 + contrast]`.
    pub contrast: f32,
    /// Factor drawn from `[max(0, 1 - saturation), 1 + saturation]`.
    pub saturation: f32,
    /// Shift drawn from `[-hue, hue]` (of a full turn), `hue <= 0.5`.
    pub hue: f32,
}

impl ColorJitter {
    /// Whether the amounts are ones torchvision takes.
    pub(crate) fn check(&self) -> Result<(), String> {
        let all = [self.brightness, self.contrast, self.saturation, self.hue];
        if all.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return Err(format!("color_jitter amounts must be finite and non-negative, not {all:?}"));
        }
        if self.hue > 0.5 {
            return Err(format!("color_jitter hue {} is more than 0.5 (half a turn)", self.hue));
        }
        Ok(())
    }
}

/// How an image's output window is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Crop {
    /// torchvision `RandomResizedCrop(size, scale, ratio)`: an area fraction from `scale` and
    /// a log-uniform aspect ratio from `ratio`, up to 10 tries, then a center crop with the
    /// ratio clamped; resized to `size`.
    RandomResized {
        /// Area fraction range, e.g. `[0.08, 1.0]`.
        scale: [f32; 2],
        /// Aspect ratio (width / height) range, e.g. `[0.75, 1.3333]`.
        ratio: [f32; 2],
    },
    /// torchvision `Resize(resize)` (shorter side) then `CenterCrop(size)`. `resize` defaults
    /// to `size * 256 / 224` on the shorter output side, as ImageNet evaluation does.
    Center {
        /// Shorter side after the resize.
        resize: Option<u32>,
    },
    /// The whole image squashed to `size` (aspect ratio not kept).
    Squash,
}

impl Crop {
    /// torchvision's defaults for `RandomResizedCrop`.
    pub fn random_resized() -> Self {
        Crop::RandomResized { scale: [0.08, 1.0], ratio: [3.0 / 4.0, 4.0 / 3.0] }
    }
}

/// Channel order of an image output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
#[non_exhaustive]
pub enum ImageLayout {
    /// `[H, W, 3]`, interleaved (what decoders write; cheapest).
    #[default]
    Hwc,
    /// `[3, H, W]`, planar (what convolution layers take).
    Chw,
}

/// Per-channel normalisation in 0..=1 units, e.g. ImageNet's
/// `mean = [0.485, 0.456, 0.406]`, `std = [0.229, 0.224, 0.225]`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Normalize {
    /// Subtracted after scaling to 0..=1.
    pub mean: [f32; 3],
    /// Divided by after the subtraction.
    pub std: [f32; 3],
}

/// `.npy` decoding: optionally declare what every sample must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NpySpec {
    /// Required element type; `None` takes the first sample's.
    pub dtype: Option<Dtype>,
    /// Required shape; `None` takes the first sample's.
    pub shape: Option<Vec<usize>>,
}

pub use crate::batch::Dtype;

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Field name -> what to decode it into. Serialises as a JSON object
/// (`{"jpg": {"kind": "image", "size": [224, 224], ...}, "cls": {"kind": "int"}}`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeSpec {
    /// In the order given; a field appears once.
    pub fields: Vec<(String, FieldDecode)>,
}

impl Serialize for DecodeSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for DecodeSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = DecodeSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of field name -> decode spec")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> std::result::Result<DecodeSpec, A::Error> {
                // Kept in the given order: columns appear in it.
                let mut fields = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, FieldDecode>()? {
                    fields.push((k, v));
                }
                Ok(DecodeSpec { fields })
            }
        }
        d.deserialize_map(Fields)
    }
}

impl DecodeSpec {
    /// An empty spec (every field raw).
    pub fn new() -> Self {
        Self::default()
    }

    /// Add (or replace) `field`.
    pub fn with(mut self, field: impl Into<String>, decode: FieldDecode) -> Self {
        let field = field.into();
        self.fields.retain(|(f, _)| *f != field);
        self.fields.push((field, decode));
        self
    }

    /// Parse the JSON form (what Python and `--decode` hand over).
    pub fn from_json(text: &str) -> Result<Self> {
        let spec: DecodeSpec =
            serde_json::from_str(text).map_err(|e| Error::invalid_option(format!("bad decode spec: {e}")))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parse the command-line form, one `FIELD=KIND[:OPTION...]` per item: `jpg=image:224`,
    /// `jpg=image:224x160:center:chw:float32:imagenet`, `cls=int`, `x=npy`, `raw=bytes`,
    /// `emb=bytes:float32:512`, `text=tokens:tokenizer.json:2048:eos=<|endoftext|>`. Tokens
    /// options: the `tokenizer.json` path and `seq_len` first, then `bos=T`, `eos=T` (an id or
    /// the token's text), `pad=N`, `int64` or `uint16`, `no_truncate`. Image options: a size (`224` or `HxW`), `random` (the default
    /// crop) / `center` / `squash`, `flip` or `flip=P`, `hwc` / `chw`, `uint8` / `float16` /
    /// `float32`, `imagenet` (ImageNet mean and std; needs a float type), `max_pixels=N`.
    pub fn from_args<S: AsRef<str>>(items: &[S]) -> Result<Self> {
        let mut spec = DecodeSpec::new();
        for item in items {
            let item = item.as_ref();
            let bad = |why: String| Error::invalid_option(format!("--decode `{item}`: {why}"));
            let (field, rest) =
                item.split_once('=').ok_or_else(|| bad("expected FIELD=KIND, e.g. jpg=image:224".into()))?;
            let mut parts = rest.split(':');
            let kind = parts.next().unwrap_or_default();
            let opts: Vec<&str> = parts.collect();
            let d = match kind {
                "image" => FieldDecode::Image(image_from_args(&opts).map_err(bad)?),
                "int" | "cls" if opts.is_empty() => FieldDecode::Int,
                "npy" if opts.is_empty() => FieldDecode::Npy(NpySpec::default()),
                "bytes" if opts.is_empty() => FieldDecode::Bytes,
                "bytes" => {
                    let mut dtype = Dtype::U8;
                    let mut shape = Vec::new();
                    for o in &opts {
                        match dtype_named(o) {
                            Some(t) => dtype = t,
                            None => {
                                shape = o
                                    .split('x')
                                    .map(|d| {
                                        d.parse::<usize>().map_err(|_| {
                                            bad(format!("`{o}` is neither a dtype nor a shape like 512 or 16x32"))
                                        })
                                    })
                                    .collect::<Result<_>>()?
                            }
                        }
                    }
                    FieldDecode::Fixed(FixedSpec { dtype, shape })
                }
                "tokens" => FieldDecode::Tokens(tokens_from_args(&opts).map_err(bad)?),
                other => {
                    return Err(bad(format!(
                        "unknown kind `{other}` (image, int, npy, bytes, tokens), or options it does not take"
                    )))
                }
            };
            if spec.get(field).is_some() {
                return Err(bad(format!("field `{field}` is given twice")));
            }
            spec = spec.with(field, d);
        }
        spec.validate()?;
        Ok(spec)
    }

    /// The spec for `field`, if it is decoded.
    pub fn get(&self, field: &str) -> Option<&FieldDecode> {
        self.fields.iter().find(|(f, _)| f == field).map(|(_, d)| d)
    }

    /// Refuse specs that cannot work, naming the field and the fix.
    pub fn validate(&self) -> Result<()> {
        for (i, (name, d)) in self.fields.iter().enumerate() {
            if self.fields[..i].iter().any(|(n, _)| n == name) {
                return Err(Error::invalid_option(format!("decode spec names field `{name}` twice")));
            }
            let bad = |m: String| Error::invalid_option(format!("decode spec for `{name}`: {m}"));
            match d {
                FieldDecode::Image(s) => s.validate().map_err(bad)?,
                FieldDecode::Fixed(f) => check_value(f.dtype.size(), &f.shape).map_err(bad)?,
                // The element type may come from the data: checked again once it is known.
                FieldDecode::Npy(NpySpec { dtype, shape: Some(shape) }) => {
                    check_value(dtype.map_or(1, Dtype::size), shape).map_err(bad)?
                }
                FieldDecode::Tokens(t) => {
                    t.validate().map_err(bad)?;
                    let lengths = TokensSpec::lengths_field(name);
                    if self.get(&lengths).is_some() {
                        return Err(bad(format!("its lengths go in `{lengths}`, which the spec also names")));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The most bytes one sample's declared value (`Fixed`, `Npy` with a shape) may take: a batch
/// holds batch-size of them, allocated before a byte is decoded.
pub(crate) const MAX_VALUE_BYTES: u64 = 1 << 30;

/// A value of `shape` in `size`-byte elements within [`MAX_VALUE_BYTES`], or why not.
pub(crate) fn check_value(size: usize, shape: &[usize]) -> std::result::Result<(), String> {
    let bytes = shape.iter().try_fold(size as u64, |a, &d| a.checked_mul(d as u64));
    match bytes {
        Some(b) if b <= MAX_VALUE_BYTES => Ok(()),
        _ => Err(format!(
            "shape {shape:?} of {size}-byte elements is more than {MAX_VALUE_BYTES} bytes a sample: a batch is \
             allocated at its size before anything is decoded"
        )),
    }
}

fn dtype_named(name: &str) -> Option<Dtype> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

fn tokens_from_args(opts: &[&str]) -> std::result::Result<TokensSpec, String> {
    let usage = "expected tokens:TOKENIZER.json:SEQ_LEN[:bos=T][:eos=T][:pad=N][:int64|:uint16][:no_truncate]";
    let (Some(path), Some(len)) = (opts.first(), opts.get(1)) else { return Err(usage.into()) };
    let seq_len = len.parse().map_err(|_| format!("seq_len `{len}` is not a number; {usage}"))?;
    let mut s = TokensSpec::new(*path, seq_len);
    let token = |t: &str| t.parse().map(TokenRef::Id).unwrap_or_else(|_| TokenRef::Text(t.to_string()));
    for &o in &opts[2..] {
        match o.split_once('=') {
            Some(("bos", t)) => s.bos = Some(token(t)),
            Some(("eos", t)) => s.eos = Some(token(t)),
            Some(("pad", n)) => s.pad_id = n.parse().map_err(|_| format!("pad `{n}` is not an integer"))?,
            None if matches!(o, "int64" | "int32" | "uint16") => s.dtype = dtype_named(o).unwrap_or(Dtype::I32),
            None if o == "no_truncate" => s.truncate = false,
            _ => return Err(format!("unknown option `{o}`; {usage}")),
        }
    }
    Ok(s)
}

fn image_from_args(opts: &[&str]) -> std::result::Result<ImageSpec, String> {
    let mut s = ImageSpec { crop: Crop::random_resized(), ..ImageSpec::default() };
    for &o in opts {
        match o {
            "random" | "random_resized" => s.crop = Crop::random_resized(),
            "center" => s.crop = Crop::Center { resize: None },
            "squash" => s.crop = Crop::Squash,
            "flip" => s.flip = 0.5,
            "hwc" | "HWC" => s.layout = ImageLayout::Hwc,
            "chw" | "CHW" => s.layout = ImageLayout::Chw,
            "imagenet" => s.normalize = Some(Normalize { mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225] }),
            _ => {
                if let Some(p) = o.strip_prefix("flip=") {
                    s.flip = p.parse().map_err(|_| format!("flip=`{p}` is not a probability"))?;
                } else if let Some(v) = o.strip_prefix("blur=") {
                    // blur=KERNEL,SIGMA_LO,SIGMA_HI[,P]
                    let parts: Vec<f32> =
                        v.split(',').map(|x| x.parse::<f32>()).collect::<Result<_, _>>().unwrap_or_default();
                    let (kernel, sigma, p) = match parts[..] {
                        [k, lo, hi] => (k, [lo, hi], 1.0),
                        [k, lo, hi, p] => (k, [lo, hi], p),
                        _ => return Err(format!("blur=`{v}` is not KERNEL,SIGMA_LO,SIGMA_HI[,P]")),
                    };
                    if kernel.fract() != 0.0 || kernel < 0.0 {
                        return Err(format!("blur kernel `{kernel}` is not a whole number of taps"));
                    }
                    s.blur = Some(Blur { kernel: kernel as u32, sigma, p });
                } else if let Some(p) = o.strip_prefix("gray=") {
                    s.grayscale = p.parse().map_err(|_| format!("gray=`{p}` is not a probability"))?;
                } else if let Some(v) = o.strip_prefix("jitter=") {
                    let amounts: Vec<f32> =
                        v.split(',').map(|x| x.parse::<f32>()).collect::<Result<_, _>>().unwrap_or_default();
                    let [brightness, contrast, saturation, hue] = amounts[..] else {
                        return Err(format!("jitter=`{v}` is not four amounts, brightness,contrast,saturation,hue"));
                    };
                    s.color_jitter = Some(ColorJitter { brightness, contrast, saturation, hue });
                } else if let Some(n) = o.strip_prefix("max_pixels=") {
                    s.max_pixels = n.parse().map_err(|_| format!("max_pixels=`{n}` is not a number"))?;
                } else if let Some(t) = dtype_named(o) {
                    s.dtype = t;
                } else {
                    let dims: Vec<u32> = o
                        .split('x')
                        .map(|d| d.parse::<u32>())
                        .collect::<std::result::Result<_, _>>()
                        .map_err(|_| format!("unknown image option `{o}`"))?;
                    s.size = match dims[..] {
                        [n] => [n, n],
                        [h, w] => [h, w],
                        _ => return Err(format!("size `{o}` must be N or HxW")),
                    };
                }
            }
        }
    }
    Ok(s)
}

impl ImageSpec {
    /// Bytes of one decoded output.
    pub fn out_bytes(&self) -> usize {
        self.size[0] as usize * self.size[1] as usize * 3 * self.dtype.size()
    }

    /// The output's shape per sample.
    pub fn shape(&self) -> Vec<usize> {
        let (h, w) = (self.size[0] as usize, self.size[1] as usize);
        match self.layout {
            ImageLayout::Hwc => vec![h, w, 3],
            ImageLayout::Chw => vec![3, h, w],
        }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let [h, w] = self.size;
        if h == 0 || w == 0 || h > 16384 || w > 16384 {
            return Err(format!("size {h}x{w} must be 1..=16384 on each side"));
        }
        if !matches!(self.dtype, Dtype::U8 | Dtype::F16 | Dtype::F32) {
            return Err(format!("dtype {} is not one of uint8, float16, float32", self.dtype));
        }
        if self.normalize.is_some() && self.dtype == Dtype::U8 {
            return Err("normalize needs dtype float16 or float32".into());
        }
        if let Some(n) = &self.normalize {
            if n.std.iter().any(|s| !(s.is_finite() && *s != 0.0)) || n.mean.iter().any(|m| !m.is_finite()) {
                return Err(format!("normalize mean {:?} / std {:?} must be finite with std != 0", n.mean, n.std));
            }
        }
        if !(0.0..=1.0).contains(&self.flip) {
            return Err(format!("flip probability {} must be within 0..=1", self.flip));
        }
        if !(0.0..=1.0).contains(&self.grayscale) {
            return Err(format!("grayscale probability {} must be within 0..=1", self.grayscale));
        }
        if let Some(j) = &self.color_jitter {
            j.check()?;
        }
        if let Some(b) = &self.blur {
            let sigma_ok = b.sigma.iter().all(|s| s.is_finite() && *s > 0.0) && b.sigma[0] <= b.sigma[1];
            if b.kernel < 3 || b.kernel % 2 == 0 || b.kernel > 255 || !sigma_ok || !(0.0..=1.0).contains(&b.p) {
                return Err(format!(
                    "blur kernel {} must be odd within 3..=255, sigma {:?} positive with lo <= hi, p {} within 0..=1",
                    b.kernel, b.sigma, b.p
                ));
            }
            let [h, w] = self.size;
            if b.kernel / 2 >= h.min(w) {
                return Err(format!("blur kernel {} is wider than the {h}x{w} output can reflect", b.kernel));
            }
        }
        if self.max_pixels == 0 {
            return Err("max_pixels must be at least 1".into());
        }
        match self.crop {
            Crop::RandomResized { scale, ratio } => {
                let ok = |r: [f32; 2]| r[0].is_finite() && r[1].is_finite() && r[0] > 0.0 && r[0] <= r[1];
                if !ok(scale) || scale[1] > 1.0 {
                    return Err(format!("random_resized scale {scale:?} must be 0 < lo <= hi <= 1"));
                }
                if !ok(ratio) {
                    return Err(format!("random_resized ratio {ratio:?} must be 0 < lo <= hi"));
                }
            }
            Crop::Center { resize: Some(r) } if r < h.min(w) => {
                return Err(format!("center resize {r} is smaller than the crop {h}x{w}"));
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_form() {
        let s = DecodeSpec::from_args(&[
            "jpg=image:224x160:center:chw:float32:imagenet:flip",
            "cls=int",
            "e=bytes:float32:4x8",
        ])
        .unwrap();
        let FieldDecode::Image(img) = s.get("jpg").unwrap() else { panic!("{s:?}") };
        assert_eq!(
            (img.size, img.crop, img.layout, img.dtype, img.flip),
            ([224, 160], Crop::Center { resize: None }, ImageLayout::Chw, Dtype::F32, 0.5)
        );
        assert!(img.normalize.is_some());
        assert_eq!(s.get("cls"), Some(&FieldDecode::Int));
        assert_eq!(s.get("e"), Some(&FieldDecode::Fixed(FixedSpec { dtype: Dtype::F32, shape: vec![4, 8] })));
        let d = DecodeSpec::from_args(&["jpg=image:224"]).unwrap();
        let FieldDecode::Image(img) = d.get("jpg").unwrap() else { panic!() };
        assert_eq!((img.size, img.crop, img.flip), ([224, 224], Crop::random_resized(), 0.0));
        let c = DecodeSpec::from_args(&["jpg=image:224:jitter=0.2,0.2,0.2,0.1:gray=0.1:blur=23,0.1,2,0.5"]).unwrap();
        let FieldDecode::Image(img) = c.get("jpg").unwrap() else { panic!() };
        let want = ColorJitter { brightness: 0.2, contrast: 0.2, saturation: 0.2, hue: 0.1 };
        assert_eq!((img.color_jitter, img.grayscale), (Some(want), 0.1));
        assert_eq!(img.blur, Some(Blur { kernel: 23, sigma: [0.1, 2.0], p: 0.5 }));
        // JSON round trip keeps the order of fields.
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(DecodeSpec::from_json(&json).unwrap(), s);
        for (bad, why) in [
            (&["jpg"][..], "FIELD=KIND"),
            (&["jpg=gif"][..], "unknown kind"),
            (&["jpg=image:big"][..], "big"),
            (&["jpg=image:1x2x3"][..], "N or HxW"),
            (&["jpg=image:uint8:imagenet"][..], "float"),
            (&["a=int", "a=npy"][..], "twice"),
            (&["jpg=image:jitter=0.2,0.2"][..], "four amounts"),
            (&["jpg=image:jitter=0.2,0.2,0.2,0.7"][..], "hue"),
            (&["jpg=image:gray=2"][..], "grayscale probability"),
            (&["jpg=image:blur=4,1,2"][..], "odd"),
            (&["jpg=image:blur=5.5,1,2"][..], "whole number"),
            (&["jpg=image:8:blur=17,1,2"][..], "wider"),
        ] {
            let e = DecodeSpec::from_args(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
