//! Decoding and augmentation on the Loader's threads, straight into the batch's columns.
//!
//! A [`DecodeSpec`] names, per field, what the bytes become: an image tensor of fixed size
//! (JPEG, PNG, WebP; random-resized or center crop, flip, normalise), an `int64` label, a
//! stacked `.npy` array, text tokenized into fixed-length rows, or raw bytes. A [`Decoder`] runs the spec over a batch of read
//! samples on a pool of `threads` threads, each sample writing its output into its own slot
//! of a fixed-width column (pooled; page-locked with a device), with per-thread scratch
//! buffers reused across images. The threads' working memory is charged to one
//! [`DecodeMemory`] budget: a huge image waits for room instead of every thread holding one.
//!
//! Augmentation is a pure function of `(seed, epoch, sample index)` ([`SampleRng`]): which
//! thread decodes a sample, how many ranks or workers there are, and where a run resumed
//! change nothing in its tensor.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use crate::batch::{Batch, BatchPool, ColumnType};
use crate::error::{Error, Result};
use crate::sample::Sample;
use crate::source::DynSampleSource;

mod array;
mod budget;
mod engine;
pub mod image;
mod rng;
mod spec;
mod text;
mod tokens;
mod workers;

pub use array::{parse_int, parse_npy, NpyHeader};
pub use budget::{DecodeMemory, OverBudget, Reservation};
pub use image::blur::gaussian_blur;
pub use image::color::{apply as apply_color, ColorOp};
pub use image::{decode_image, decode_image_within, ImageError, ImageScratch};
pub use rng::SampleRng;
pub use spec::{
    Blur, ColorJitter, Crop, DecodeSpec, Dtype, FieldDecode, FixedSpec, ImageLayout, ImageSpec, Normalize, NpySpec,
    TokenRef, TokensSpec,
};
pub(crate) use text::PIECE_BYTES;
pub use text::{TextTokenizer, MAX_TOKENIZER_BYTES};
pub use tokens::MAX_SEQ_LEN;

/// One decoded field as the decoder runs it.
#[derive(Debug)]
struct Plan {
    name: Arc<str>,
    decode: FieldDecode,
    /// Fixed for the run: declared (images, ints, a fully declared npy) or taken from the
    /// first sample that has the field (npy).
    ty: Mutex<Option<Arc<ColumnType>>>,
    /// The loaded tokenizer of a `Tokens` field.
    tokenize: Option<tokens::Tokenize>,
}

/// Runs a [`DecodeSpec`] over batches. Shared by the Loader's producer tasks.
pub struct Decoder {
    plans: Vec<Plan>,
    seed: u64,
    /// Added to a sample's index for its draws: the index in the whole source of the first
    /// sample of the part decoded ([`with_first_index`](Self::with_first_index)).
    first: u64,
    /// With more than one thread; one thread decodes on the caller's.
    workers: Option<workers::Workers>,
    /// The scratch of inline decoding (one thread, or fields too cheap to spread). Batches
    /// decoded concurrently take turns on it, so `threads = 1` means one thread decoding at a
    /// time, as `threads = N` means N, whatever the number of batches in flight.
    inline: Mutex<ImageScratch>,
    /// What the decode threads' images may hold at once, all together.
    memory: DecodeMemory,
}

/// The decode memory budget of a [`Decoder`] made without one: the Loader's default
/// `max_bytes_in_flight`, which is what it uses when `decode_memory_bytes` is not set.
pub const DEFAULT_DECODE_MEMORY_BYTES: u64 = 1 << 30;

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("fields", &self.plans.iter().map(|p| (&*p.name, &p.decode)).collect::<Vec<_>>())
            .field("seed", &self.seed)
            .field("threads", &self.threads())
            .field("memory", &self.memory.limit())
            .finish()
    }
}

/// The batch's output column, shared by the decode threads: each writes only the rows it
/// claimed from an atomic counter, so the slices never overlap.
#[derive(Clone, Copy)]
struct Rows {
    base: *mut u8,
    width: usize,
    len: usize,
}

// SAFETY: see `Rows::row`: distinct threads get distinct rows.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

impl Rows {
    /// # Safety
    /// `r < len`, and no other live slice covers row `r`.
    unsafe fn row<'a>(self, r: usize) -> &'a mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.base.add(r * self.width), self.width) }
    }
}

/// A row that failed: its position in the batch, the field, and why.
type RowError = (usize, Arc<str>, String);

/// The row of a [`RowError`] that is the batch's, not a sample's: a column the batch's sizes
/// make too large to allocate.
const WHOLE_BATCH: usize = usize::MAX;

impl Decoder {
    /// A decoder for `spec` whose augmentation draws from `seed`, on `threads` threads (1
    /// decodes on the calling thread), within [`DEFAULT_DECODE_MEMORY_BYTES`] (see
    /// [`with_memory_budget`](Self::with_memory_budget)).
    pub fn new(spec: &DecodeSpec, seed: u64, threads: usize) -> Result<Self> {
        spec.validate()?;
        let plans = spec
            .fields
            .iter()
            .filter(|(_, d)| !matches!(d, FieldDecode::Bytes))
            .map(|(name, d)| {
                let tokenize = match d {
                    FieldDecode::Tokens(t) => Some(tokens::Tokenize::load(name, t)?),
                    _ => None,
                };
                Ok(Plan { name: name.as_str().into(), decode: d.clone(), ty: Mutex::new(declared(d)), tokenize })
            })
            .collect::<Result<_>>()?;
        let workers = if threads > 1 {
            Some(workers::Workers::new(threads).map_err(|e| Error::resource(format!("{threads} decode threads"), e))?)
        } else {
            None
        };
        let scratches = Self::scratches(workers.as_ref());
        let memory = DecodeMemory::new(DEFAULT_DECODE_MEMORY_BYTES, scratches);
        Ok(Decoder { plans, seed, first: 0, workers, inline: Mutex::new(ImageScratch::default()), memory })
    }

    /// The decoder with a budget of `bytes` for the working memory of all its decode threads
    /// together (decoded pixels, codec buffers, resize scratch; see [`DecodeMemory`]).
    pub fn with_memory_budget(mut self, bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(Error::invalid_option("decode_memory_bytes must be at least 1 (a budget in bytes)"));
        }
        self.memory = DecodeMemory::new(bytes, Self::scratches(self.workers.as_ref()));
        Ok(self)
    }

    /// The decoder of a part of a source whose sample 0 is sample `first` of the whole: each
    /// sample draws its augmentation by its index in the whole, as a decoder of the whole does.
    pub fn with_first_index(mut self, first: u64) -> Self {
        self.first = first;
        self
    }

    /// Bytes a row of the columns whose types are declared takes (images, labels, arrays of a
    /// declared shape, token sequences): what every batch allocates per row before a byte is
    /// decoded. Saturating.
    pub fn declared_row_bytes(&self) -> u64 {
        let rows = self.plans.iter().filter_map(|p| declared(&p.decode)).map(|t| t.row_bytes() as u64);
        rows.fold(0u64, u64::saturating_add)
    }

    /// Refuse batches of `batch_size` rows whose declared columns could never be allocated:
    /// more bytes than the machine has memory (the allocation would abort the process, not
    /// fail with an error).
    pub fn check_batch(&self, batch_size: usize) -> Result<()> {
        let row = self.declared_row_bytes();
        let Some(memory) = physical_memory() else { return Ok(()) };
        let batch = row.saturating_mul(batch_size as u64);
        if batch > memory {
            return Err(Error::invalid_option(format!(
                "a batch of {batch_size} rows of the decoded columns ({row} bytes a row) takes {batch} bytes, more \
                 than this machine's {memory} bytes of memory; lower the batch size or the decoded shapes"
            )));
        }
        Ok(())
    }

    /// The budget the decode threads share.
    pub fn memory(&self) -> &DecodeMemory {
        &self.memory
    }

    /// Scratches kept between images: one per decode thread, and the inline one (with
    /// threads, batches of one image and the rows of a skipped batch decode inline).
    fn scratches(workers: Option<&workers::Workers>) -> usize {
        workers.map_or(1, |w| w.threads() + 1)
    }

    /// Threads decoding at once.
    pub fn threads(&self) -> usize {
        self.workers.as_ref().map_or(1, workers::Workers::threads)
    }

    /// Whether `field` is decoded (it becomes a fixed-width column), or is the lengths column
    /// of a tokenized field (a raw field of that name would be overwritten: it is left out).
    pub fn decodes(&self, field: &str) -> bool {
        self.plans.iter().any(|p| &*p.name == field || p.tokenize.as_ref().is_some_and(|t| &*t.lengths == field))
    }

    /// The column type of `field` once known (declared, or seen in a first sample).
    pub fn column_type(&self, field: &str) -> Option<Arc<ColumnType>> {
        let p = self.plans.iter().find(|p| &*p.name == field)?;
        p.ty.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Decode `samples` (read from source `indices` in `epoch`) into a batch of `pool`.
    /// `source` names where they came from in errors. A sample that cannot be decoded fails
    /// the batch with [`Error::Decode`] naming it, or, with `skip`, is left out and returned
    /// in the count.
    #[allow(clippy::too_many_arguments)] // the batch's identity, its contents and the policy
    pub fn assemble(
        &self,
        pool: &BatchPool,
        source: &DynSampleSource,
        epoch: u64,
        number: u64,
        indices: &[u64],
        samples: &[Sample],
        skip: bool,
    ) -> Result<(Batch, u64)> {
        match self.try_assemble(pool, epoch, number, indices, samples) {
            Ok(b) => Ok((b, 0)),
            // No sample is to blame, and none is skipped: the sizes chosen are.
            Err((WHOLE_BATCH, _, why)) => Err(Error::invalid_option(why)),
            Err(e) if !skip => Err(self.decode_error(source, indices, samples, e)),
            Err(_) => {
                // Rare path: find every bad row, then build again without them. Decoding is
                // deterministic, so the good rows come out the same.
                let mut bad = vec![false; samples.len()];
                for (i, s) in samples.iter().enumerate() {
                    let mut one = pool.builder();
                    one.push_raw(indices[i], s, |f| self.decodes(f));
                    bad[i] = self.fill(&mut one, epoch, &indices[i..=i], std::slice::from_ref(s)).is_err();
                }
                let keep: Vec<usize> = (0..samples.len()).filter(|&i| !bad[i]).collect();
                let idx: Vec<u64> = keep.iter().map(|&i| indices[i]).collect();
                let kept: Vec<Sample> = keep.iter().map(|&i| samples[i].clone()).collect();
                let skipped = (samples.len() - kept.len()) as u64;
                match self.try_assemble(pool, epoch, number, &idx, &kept) {
                    Ok(b) => Ok((b, skipped)),
                    Err((WHOLE_BATCH, _, why)) => Err(Error::invalid_option(why)),
                    Err(e) => Err(self.decode_error(source, &idx, &kept, e)),
                }
            }
        }
    }

    /// The error of row `e` of a batch of `samples`, read from `source`'s `indices`: where it
    /// lies (in `source`, which a part's indices number), and its index in the whole.
    fn decode_error(&self, source: &DynSampleSource, indices: &[u64], samples: &[Sample], e: RowError) -> Error {
        let (row, field, reason) = e;
        let index = indices.get(row).copied().unwrap_or_default();
        let source_name = match source.location(index as usize) {
            Some(place) => format!("{place} of {source}"),
            None => source.to_string(),
        };
        Error::Decode {
            source_name,
            key: samples.get(row).map_or_else(String::new, |s| s.key.clone()),
            index: index.saturating_add(self.first),
            field: field.to_string(),
            reason,
        }
    }

    fn try_assemble(
        &self,
        pool: &BatchPool,
        epoch: u64,
        number: u64,
        indices: &[u64],
        samples: &[Sample],
    ) -> std::result::Result<Batch, RowError> {
        let mut b = pool.builder();
        for (s, &i) in samples.iter().zip(indices) {
            b.push_raw(i, s, |f| self.decodes(f));
        }
        self.fill(&mut b, epoch, indices, samples)?;
        Ok(b.finish(epoch, number))
    }

    /// Write every decoded column of the rows begun in `b`.
    fn fill(
        &self,
        b: &mut crate::batch::BatchBuilder,
        epoch: u64,
        indices: &[u64],
        samples: &[Sample],
    ) -> std::result::Result<(), RowError> {
        for plan in &self.plans {
            let ty = self.type_for(plan, samples)?;
            let width = ty.row_bytes();
            // Not a row's fault: the batch's size asks too much.
            let out = b.fixed(&plan.name, &ty).map_err(|e| (WHOLE_BATCH, plan.name.clone(), e.to_string()))?;
            // What a row holds before its padding (tokens only), written by whichever thread.
            let used: Vec<AtomicU32> = match plan.tokenize {
                Some(_) => (0..samples.len()).map(|_| AtomicU32::new(0)).collect(),
                None => Vec::new(),
            };
            let row = |r: usize, slot: &mut [u8], scratch: &mut ImageScratch| -> std::result::Result<(), RowError> {
                let s = &samples[r];
                let data = s.field(&plan.name).ok_or_else(|| {
                    let have = s.field_names().collect::<Vec<_>>().join(", ");
                    (r, plan.name.clone(), format!("the sample has no such field; it has: {have}"))
                })?;
                let rng = SampleRng::new(self.seed, epoch, indices[r].saturating_add(self.first));
                let n = self.decode_one(plan, &ty, rng, data, slot, scratch).map_err(|m| (r, plan.name.clone(), m))?;
                if let Some(u) = used.get(r) {
                    u.store(n, Relaxed);
                }
                Ok(())
            };
            let heavy = matches!(plan.decode, FieldDecode::Image(_) | FieldDecode::Tokens(_));
            match &self.workers {
                // Labels and arrays cost less than waking other threads.
                Some(w) if heavy && samples.len() > 1 => {
                    let rows = Rows { base: out.as_mut_ptr(), width, len: samples.len() };
                    let next = AtomicUsize::new(0);
                    let stop = AtomicBool::new(false);
                    let failed: Mutex<Option<RowError>> = Mutex::new(None);
                    let finished = w.run(&|scratch: &mut ImageScratch| {
                        while !stop.load(Relaxed) {
                            let r = next.fetch_add(1, Relaxed);
                            if r >= rows.len {
                                break;
                            }
                            // SAFETY: `r` was claimed once, by this thread, and is in range.
                            let slot = unsafe { rows.row(r) };
                            if let Err(e) = row(r, slot, scratch) {
                                stop.store(true, Relaxed);
                                let mut f = failed.lock().unwrap_or_else(|e| e.into_inner());
                                // The first failing row is reported, whichever thread saw it first.
                                if f.as_ref().is_none_or(|g| e.0 < g.0) {
                                    *f = Some(e);
                                }
                            }
                        }
                    });
                    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
                        return Err(e);
                    }
                    if !finished {
                        return Err((
                            0,
                            plan.name.clone(),
                            "a decode thread panicked (a bug: please report it)".into(),
                        ));
                    }
                }
                _ => {
                    let scratch = &mut *self.inline.lock().unwrap_or_else(|e| e.into_inner());
                    match width {
                        // Values of no bytes (a declared shape with a 0): each is still checked,
                        // so a value of another length is an error, not dropped.
                        0 => (0..samples.len()).try_for_each(|r| row(r, &mut [], scratch))?,
                        _ => out.chunks_mut(width).enumerate().try_for_each(|(r, slot)| row(r, slot, scratch))?,
                    }
                }
            }
            if let Some(t) = &plan.tokenize {
                let lengths = b
                    .fixed(&t.lengths, &ColumnType::new(Dtype::I32, Vec::new()))
                    .map_err(|e| (WHOLE_BATCH, t.lengths.clone(), e.to_string()))?;
                for (o, u) in lengths.chunks_exact_mut(4).zip(&used) {
                    o.copy_from_slice(&(u.load(Relaxed) as i32).to_ne_bytes());
                }
            }
        }
        Ok(())
    }

    /// The plan's column type, fixing it from this batch's first sample if not yet known.
    fn type_for(&self, plan: &Plan, samples: &[Sample]) -> std::result::Result<Arc<ColumnType>, RowError> {
        let mut ty = plan.ty.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = ty.as_ref() {
            return Ok(t.clone());
        }
        let FieldDecode::Npy(spec) = &plan.decode else { unreachable!("non-npy types are declared") };
        let Some((r, data)) = samples.iter().enumerate().find_map(|(r, s)| s.field(&plan.name).map(|d| (r, d))) else {
            return Err((0, plan.name.clone(), "no sample of the batch has this field".into()));
        };
        let h = parse_npy(data).map_err(|m| (r, plan.name.clone(), m))?;
        let t = ColumnType::new(spec.dtype.unwrap_or(h.dtype), spec.shape.clone().unwrap_or(h.shape));
        // A declared shape in the data's element type (the array's own is within its bytes).
        spec::check_value(t.dtype.size(), &t.shape).map_err(|m| (r, plan.name.clone(), m))?;
        *ty = Some(t.clone());
        Ok(t)
    }

    fn decode_one(
        &self,
        plan: &Plan,
        ty: &ColumnType,
        mut rng: SampleRng,
        data: &[u8],
        out: &mut [u8],
        scratch: &mut ImageScratch,
    ) -> std::result::Result<u32, String> {
        match &plan.decode {
            FieldDecode::Image(spec) => {
                decode_image_within(&self.memory, spec, data, &mut rng, scratch, out).map_err(|e| e.to_string())?;
                Ok(0)
            }
            FieldDecode::Int => {
                out.copy_from_slice(&parse_int(data)?.to_ne_bytes());
                Ok(0)
            }
            FieldDecode::Tokens(spec) => match &plan.tokenize {
                Some(t) => t.row(spec, data, out),
                None => Err("the tokenizer was not loaded (a bug: please report it)".into()),
            },
            FieldDecode::Npy(_) => {
                let h = parse_npy(data)?;
                if h.dtype != ty.dtype || h.shape != ty.shape {
                    return Err(format!(
                        "array is {} {:?} but this run's arrays are {} {:?} (set by the first sample, or declared); \
                         pad or resize them to one shape, or read the field raw",
                        h.dtype, h.shape, ty.dtype, ty.shape
                    ));
                }
                array::copy_npy(&h, data, out);
                Ok(0)
            }
            FieldDecode::Fixed(_) => {
                if data.len() != out.len() {
                    return Err(format!(
                        "value is {} bytes but the field is declared {} {:?} = {} bytes",
                        data.len(),
                        ty.dtype,
                        ty.shape,
                        out.len()
                    ));
                }
                out.copy_from_slice(data);
                Ok(0)
            }
            FieldDecode::Bytes => Ok(0),
        }
    }
}

/// The machine's memory in bytes, if the system says.
fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf reads a system setting; it has no preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages > 0 && size > 0).then(|| (pages as u64).saturating_mul(size as u64))
}

fn declared(d: &FieldDecode) -> Option<Arc<ColumnType>> {
    match d {
        FieldDecode::Image(s) => Some(ColumnType::new(s.dtype, s.shape())),
        FieldDecode::Int => Some(ColumnType::new(Dtype::I64, Vec::new())),
        FieldDecode::Fixed(f) => Some(ColumnType::new(f.dtype, f.shape.clone())),
        FieldDecode::Tokens(t) => Some(ColumnType::new(t.dtype, vec![t.seq_len])),
        FieldDecode::Npy(NpySpec { dtype: Some(t), shape: Some(s) }) => Some(ColumnType::new(*t, s.clone())),
        _ => None,
    }
}
