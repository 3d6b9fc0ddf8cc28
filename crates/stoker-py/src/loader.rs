//! `Loader`, `Epoch` and `Batch`: the Rust Loader per process, its epochs, and batches whose
//! columns are handed to Python zero-copy through DLPack.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyIndexError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use stoker::loader::{EpochStream, Loader as RsLoader, LoaderConfig, LoaderState};
use stoker::sampler::{Partition, Tail};

use crate::dlpack::DlPack;

use crate::errors::{err, InvalidInputError, StokerError};
use crate::runtime::{block_on, runtime, Local};
use crate::source::Source;

/// The Rust Loader for one source, built again in a forked child: the one made in the parent
/// spawns its producers on the parent's runtime and reads through the parent's connections,
/// neither of which runs in the child, so using it there would wait forever.
#[pyclass(module = "stoker._stoker")]
pub(crate) struct Loader {
    source: Py<Source>,
    cfg: LoaderConfig,
    /// The loader, built by this process or the one it was forked from.
    built: Mutex<Local<Arc<RsLoader>>>,
}

impl Loader {
    fn build(py: Python<'_>, source: &Source, cfg: LoaderConfig) -> PyResult<Arc<RsLoader>> {
        let src = source.get_src(py)?;
        let rt = runtime()?;
        let _guard = rt.enter();
        Ok(Arc::new(RsLoader::new(src, cfg).map_err(err)?))
    }

    /// This process's loader. In a forked child, a new one that keeps a resume state loaded
    /// in the parent and not yet started, so the next iteration is the one the parent would
    /// have run; an iteration in progress in the parent is not continued (in the parent, too,
    /// a new iteration starts afresh).
    fn get(&self, py: Python<'_>) -> PyResult<Arc<RsLoader>> {
        let inherited = {
            let built = self.built.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(l) = built.here() {
                return Ok(l.clone());
            }
            built.inherited().clone()
        };
        // Read without waiting: a parent thread may have held the parent loader's lock at the
        // fork (a batch being delivered), and it is never let go here; then this starts afresh,
        // which is said.
        let pending = match inherited.pending_state_now() {
            Some(pending) => pending,
            None => {
                py.import("warnings")?.call_method1(
                    "warn",
                    ("stoker.Loader: the parent process was mid-batch when this process forked; a resume state \
                      loaded there was not taken over, and this loader starts afresh",),
                )?;
                None
            }
        };
        // Not under the lock: building waits with the GIL released and takes it back to check
        // for Ctrl-C, while another thread may hold the GIL waiting for the lock.
        let fresh = Self::build(py, self.source.get(), self.cfg.clone())?;
        if let Some(state) = pending {
            fresh.load_state(state).map_err(err)?;
        }
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if built.here().is_none() {
            *built = Local::new(fresh); // else another thread of this process built one first
        }
        Ok(built.inherited().clone())
    }
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (source, batch_size, shuffle=None, seed=0, drop_last=false, prefetch=4,
                        rank=None, world_size=None, worker=0, num_workers=1, wrap=true,
                        max_bytes_in_flight=1u64<<30, skip_errors=false, decode=None, threads=None,
                        shuffle_window=None, decode_memory_bytes=None, span=None, first_index=0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: Py<Source>,
        batch_size: usize,
        shuffle: Option<&Bound<'_, PyAny>>,
        seed: u64,
        drop_last: bool,
        prefetch: usize,
        rank: Option<u64>,
        world_size: Option<u64>,
        worker: u64,
        num_workers: u64,
        wrap: bool,
        max_bytes_in_flight: u64,
        skip_errors: bool,
        decode: Option<&str>,
        threads: Option<usize>,
        shuffle_window: Option<usize>,
        decode_memory_bytes: Option<u64>,
        span: Option<(u64, u64)>,
        first_index: u64,
    ) -> PyResult<Self> {
        let mut cfg = LoaderConfig::new(batch_size);
        cfg.order = crate::order::order(shuffle, shuffle_window, seed)?;
        if let Some(spec) = decode {
            cfg.decode = Some(stoker::decode::DecodeSpec::from_json(spec).map_err(err)?);
        }
        cfg.augment_seed = seed;
        if let Some(t) = threads {
            if t == 0 {
                return Err(InvalidInputError::new_err("threads must be at least 1"));
            }
            cfg.transform_threads = t;
        }
        cfg.decode_memory_bytes = decode_memory_bytes;
        cfg.drop_last = drop_last;
        cfg.prefetch = prefetch;
        cfg.max_bytes_in_flight = max_bytes_in_flight;
        cfg.partition = partition(rank, world_size)?;
        cfg.worker = worker;
        cfg.num_workers = num_workers;
        cfg.span = span.map(|(a, b)| a..b);
        cfg.first_index = first_index;
        cfg.tail = if wrap { Tail::Wrap } else { Tail::Drop };
        if skip_errors {
            cfg.on_error = stoker::loader::ErrorPolicy::Skip;
        }
        let loader = Self::build(py, source.get(), cfg.clone())?;
        Ok(Loader { source, cfg, built: Mutex::new(Local::new(loader)) })
    }

    /// Batches this rank (and worker) gets per epoch.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.get(py)?.batches_per_epoch().map_err(err)? as usize)
    }

    /// Start `epoch` (resuming if a loaded state is for it).
    fn epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<Epoch> {
        let loader = self.get(py)?;
        let rt = runtime()?;
        let _guard = rt.enter();
        Ok(Epoch { stream: Some(Local::new(loader.epoch(epoch).map_err(err)?)) })
    }

    /// The epoch a loaded state is for, if one is pending.
    fn resume_epoch(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        Ok(self.get(py)?.resume_epoch())
    }

    /// The resume state as JSON (samples consumed globally, seed, epoch).
    fn state(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.get(py)?
            .state()
            .map(|s| serde_json::to_string(&s))
            .transpose()
            .map_err(|e| StokerError::new_err(e.to_string()))
    }

    /// Resume from `state()` JSON on the next `epoch()` of its epoch.
    fn load_state(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        let s: LoaderState =
            serde_json::from_str(state).map_err(|e| InvalidInputError::new_err(format!("bad loader state: {e}")))?;
        self.get(py)?.load_state(s).map_err(err)
    }

    /// Statistics as a dict (consumer wait, throughput, fetch latency, retries...).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let json = serde_json::to_string(&self.get(py)?.stats()).map_err(|e| StokerError::new_err(e.to_string()))?;
        py.import("json")?.call_method1("loads", (json,))
    }
}

/// `rank` of `world_size` as given, or both from the launcher's environment (RANK,
/// WORLD_SIZE); the launcher's node numbers still say which ranks share this node's disk
/// cache, when they are for this rank.
pub(crate) fn partition(rank: Option<u64>, world_size: Option<u64>) -> PyResult<Partition> {
    match (rank, world_size) {
        (Some(r), Some(w)) => {
            let p = Partition::new(r, w).map_err(|e| err(e.into()))?;
            Ok(match Partition::from_env() {
                Ok(env) if (env.rank, env.world_size) == (r, w) => match (env.local_rank, env.local_world_size) {
                    (Some(l), Some(n)) => p.on_node(l, n).unwrap_or(p),
                    _ => p,
                },
                _ => p,
            })
        }
        (None, None) => Partition::from_env().map_err(|e| err(e.into())),
        _ => Err(InvalidInputError::new_err("give both rank and world_size, or neither (then RANK/WORLD_SIZE)")),
    }
}

/// One epoch's batches.
#[pyclass(module = "stoker._stoker")]
pub(crate) struct Epoch {
    /// Its batches, produced on the runtime of the process that started it.
    stream: Option<Local<EpochStream>>,
}

#[pymethods]
impl Epoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Batch> {
        let Some(stream) = self.stream.as_mut() else { return Err(PyStopIteration::new_err(())) };
        let Some(stream) = stream.here_mut() else {
            // Its producer ran on the parent's runtime, which does not run here: waiting on it
            // would never end.
            return Err(StokerError::new_err(
                "this epoch was started in the parent process before a fork and cannot continue in the child; \
                 start a new iteration of the loader in this process",
            ));
        };
        match block_on(py, stream.next_batch())? {
            Some(Ok(b)) => Ok(Batch { batch: Arc::new(b) }),
            Some(Err(e)) => Err(err(e)),
            None => {
                self.stream = None;
                Err(PyStopIteration::new_err(()))
            }
        }
    }
}

/// A batch: keys, indices and per-field columns, shared zero-copy through DLPack.
#[pyclass(module = "stoker._stoker", frozen)]
pub(crate) struct Batch {
    batch: Arc<stoker::batch::Batch>,
}

impl Batch {
    pub(crate) fn new(batch: stoker::batch::Batch) -> Self {
        Batch { batch: Arc::new(batch) }
    }
}

#[pymethods]
impl Batch {
    fn __len__(&self) -> usize {
        self.batch.len()
    }

    fn keys(&self) -> Vec<String> {
        self.batch.keys().map(str::to_string).collect()
    }

    fn indices(&self) -> Vec<u64> {
        self.batch.indices().to_vec()
    }

    fn fields(&self) -> Vec<String> {
        self.batch.field_names().map(str::to_string).collect()
    }

    /// `(data, offsets, dtype)`: DLPack exporters for the values and the offsets (int64,
    /// len+1), or with `capsules` their `dltensor` capsules (which `torch.from_dlpack` takes
    /// without the protocol's per-call negotiation). A decoded column's values are one
    /// `[B, *shape]` array of `dtype` (its name is returned); a raw column's are uint8 bytes
    /// back to back and `dtype` is None.
    #[pyo3(signature = (name, capsules = false))]
    fn column(
        &self,
        py: Python<'_>,
        name: &str,
        capsules: bool,
    ) -> PyResult<(Py<PyAny>, Py<PyAny>, Option<&'static str>)> {
        let col = self.batch.field(name).ok_or_else(|| {
            InvalidInputError::new_err(format!("the batch has no field `{name}`; it has {:?}", self.fields()))
        })?;
        let (ptr, len) = (col.data.as_ptr(), col.data.len());
        let (optr, olen) = (col.offsets.as_ptr(), col.offsets.len());
        let (data_shape, (code, bits), dtype) = match col.ty {
            Some(ty) => {
                let mut shape = vec![col.len() as i64];
                shape.extend(ty.shape.iter().map(|&d| d as i64));
                (shape, ty.dtype.dlpack(), Some(ty.dtype.name()))
            }
            None => (vec![len as i64], (1, 8), None),
        };
        let data = DlPack { owner: self.batch.clone(), ptr: ptr as *mut c_void, shape: data_shape, code, bits };
        let offsets =
            DlPack { owner: self.batch.clone(), ptr: optr as *mut c_void, shape: vec![olen as i64], code: 0, bits: 64 };
        Ok((data.handed(py, capsules)?, offsets.handed(py, capsules)?, dtype))
    }

    /// A token batch as the dict `stoker.TokenLoader` yields, built in one call: `input_ids`,
    /// then `position_ids`, `loss_mask`, `cu_seqlens` and `max_seqlen` unless the loader leaves
    /// them out (`columns=`), each array handed to `convert` (`torch.from_dlpack` with
    /// `capsules`, `numpy.from_dlpack` without) typed as the loader hands it out: the mask's
    /// 0/1 bytes as bool, cu_seqlens' bytes as the int32 offsets `[segments + 1]`, and
    /// `max_seqlen` the longest segment. At small batches the consumer's per-batch Python work
    /// (a call, a tuple, a protocol negotiation per column) is what limits the rate.
    fn token_dict<'py>(
        &self,
        py: Python<'py>,
        convert: &Bound<'py, PyAny>,
        capsules: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let rows = |name: &'static str, as_bool: bool| -> PyResult<()> {
            let Some(c) = self.batch.field(name) else { return Ok(()) };
            let ty = c.ty.ok_or_else(|| InvalidInputError::new_err(format!("not a token batch: `{name}` is raw")))?;
            let mut shape = vec![c.len() as i64];
            shape.extend(ty.shape.iter().map(|&d| d as i64));
            let (code, bits) = if as_bool { (6, 8) } else { ty.dtype.dlpack() };
            let dl = DlPack { owner: self.batch.clone(), ptr: c.data.as_ptr() as *mut c_void, shape, code, bits };
            out.set_item(name, dl.convert(py, convert, capsules)?)
        };
        if self.batch.field("input_ids").is_none() {
            return Err(InvalidInputError::new_err("not a token batch: no `input_ids`"));
        }
        rows("input_ids", false)?;
        rows("position_ids", false)?;
        rows("loss_mask", true)?;
        if let Some(cu) = self.batch.field("cu_seqlens") {
            let offset = |b: &[u8]| i64::from(i32::from_ne_bytes(b.try_into().unwrap_or_default()));
            let offsets = cu.data.chunks_exact(4).map(offset);
            let max_seqlen = offsets.clone().zip(offsets.skip(1)).map(|(a, b)| b - a).max().unwrap_or(0);
            let dl = DlPack {
                owner: self.batch.clone(),
                ptr: cu.data.as_ptr() as *mut c_void,
                shape: vec![(cu.data.len() / 4) as i64],
                code: 0,
                bits: 32,
            };
            out.set_item("cu_seqlens", dl.convert(py, convert, capsules)?)?;
            out.set_item("max_seqlen", max_seqlen)?;
        }
        Ok(out)
    }

    /// Every value of field `name` as text (UTF-8, invalid bytes replaced): a mix's
    /// `__source__` names, one per sample.
    fn texts(&self, name: &str) -> PyResult<Vec<String>> {
        let col = self.batch.field(name).ok_or_else(|| InvalidInputError::new_err(format!("no field `{name}`")))?;
        Ok((0..col.len()).map(|i| String::from_utf8_lossy(col.get(i).unwrap_or_default()).into_owned()).collect())
    }

    /// Sample `i`'s value of field `name` as bytes (a copy).
    fn value<'py>(&self, py: Python<'py>, name: &str, i: usize) -> PyResult<Bound<'py, PyBytes>> {
        let col = self.batch.field(name).ok_or_else(|| InvalidInputError::new_err(format!("no field `{name}`")))?;
        let v = col.get(i).ok_or_else(|| PyIndexError::new_err(format!("row {i} out of range")))?;
        crate::source::py_bytes(py, v)
    }
}
