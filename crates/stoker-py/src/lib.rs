//! `stoker._stoker`: the native half of the Python package.
//!
//! One tokio runtime per process, created lazily and created again after `fork` (a runtime's
//! threads do not survive fork; the inherited one is leaked, never used or dropped). Sources
//! are reopened per process for the same reason (connection pools, LMDB handles). Every
//! blocking call releases the GIL and, while waiting, checks for Ctrl-C.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stoker::loader::{EpochStream, Loader as RsLoader, LoaderConfig, LoaderState};
use stoker::sampler::{Order, Partition, Tail};
use stoker::{DynSampleSource, SourceOptions};

mod dlpack;
use dlpack::DlPack;

create_exception!(_stoker, StokerError, PyException, "Any error from Stoker.");
create_exception!(_stoker, NotFoundError, StokerError, "A path, object or bucket does not exist.");
create_exception!(_stoker, InvalidInputError, StokerError, "A bad URI, option, index or configuration.");
create_exception!(_stoker, CorruptDataError, StokerError, "A shard, index or LMDB file is damaged.");
create_exception!(
    _stoker,
    DecodeError,
    CorruptDataError,
    "A sample's field could not be decoded (corrupt, truncated, unsupported or oversized image; bad label or array)."
);
create_exception!(_stoker, RemoteError, StokerError, "A remote store failed (after retries when transient).");
create_exception!(_stoker, CudaUnavailableError, StokerError, "CUDA was asked for but cannot be used here.");

fn err(e: stoker::Error) -> PyErr {
    use stoker::Error as E;
    let msg = e.to_string();
    match e {
        E::NotFound { .. } | E::Empty { .. } => NotFoundError::new_err(msg),
        E::InvalidUri { .. } | E::InvalidOption { .. } | E::IndexOutOfRange { .. } | E::MissingField { .. } => {
            InvalidInputError::new_err(msg)
        }
        E::Sampler(_) | E::NotSupported { .. } => InvalidInputError::new_err(msg),
        E::CorruptTar { .. } | E::CorruptData { .. } | E::BadIndex { .. } | E::Lmdb { .. } => {
            CorruptDataError::new_err(msg)
        }
        E::Decode { .. } => DecodeError::new_err(msg),
        E::Fetch { .. } | E::Store { .. } | E::Shared(_) => RemoteError::new_err(msg),
        E::Pinned(stoker::pinned::PinnedError::CudaUnavailable { .. }) => CudaUnavailableError::new_err(msg),
        _ => StokerError::new_err(msg),
    }
}

/// A runtime and the process that made it.
type OwnedRuntime = (u32, Arc<tokio::runtime::Runtime>);

/// The process's runtime, made anew in a forked child.
fn runtime() -> PyResult<Arc<tokio::runtime::Runtime>> {
    static RT: OnceLock<Mutex<Option<OwnedRuntime>>> = OnceLock::new();
    let mut slot = RT.get_or_init(|| Mutex::new(None)).lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some((owner, rt)) = slot.as_ref() {
        if *owner == pid {
            return Ok(rt.clone());
        }
        // Inherited across fork: its worker threads are gone. Dropping it would wait for them
        // forever, so it is leaked.
        if let Some((_, old)) = slot.take() {
            std::mem::forget(old);
        }
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("stoker")
            .build()
            .map_err(|e| StokerError::new_err(format!("cannot start the I/O runtime: {e}")))?,
    );
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}

/// Run `fut` on the runtime with the GIL released, checking for Ctrl-C every 100 ms.
fn block_on<T: Send>(py: Python<'_>, fut: impl std::future::Future<Output = T> + Send) -> PyResult<T> {
    let rt = runtime()?;
    let mut fut = Box::pin(fut);
    loop {
        let step =
            py.detach(|| rt.block_on(async { tokio::time::timeout(Duration::from_millis(100), &mut fut).await }));
        match step {
            Ok(v) => return Ok(v),
            Err(_) => py.check_signals()?,
        }
    }
}

/// An opened source, reopened in each process that uses it.
#[pyclass(module = "stoker._stoker", frozen)]
struct Source {
    uri: String,
    options: String,
    opened: Mutex<Option<(u32, Arc<DynSampleSource>)>>,
}

impl Source {
    fn get_src(&self, py: Python<'_>) -> PyResult<Arc<DynSampleSource>> {
        let pid = std::process::id();
        if let Some((owner, src)) = self.opened.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            if *owner == pid {
                return Ok(src.clone());
            }
        }
        let opts = SourceOptions::from_json(&self.options).map_err(err)?;
        let uri = self.uri.clone();
        let src = block_on(py, async move { stoker::open(&uri, opts).await })?.map_err(err)?;
        *self.opened.lock().unwrap_or_else(|e| e.into_inner()) = Some((pid, src.clone()));
        Ok(src)
    }
}

fn sample_to_py<'py>(py: Python<'py>, s: &stoker::Sample) -> PyResult<Bound<'py, PyAny>> {
    let fields = PyList::empty(py);
    for f in &s.fields {
        fields.append((f.name.as_ref(), PyBytes::new(py, &f.data)))?;
    }
    Ok((s.key.as_str(), fields).into_pyobject(py)?.into_any())
}

fn index(i: i64, len: usize) -> PyResult<usize> {
    let j = if i < 0 { i + len as i64 } else { i };
    if j < 0 || j >= len as i64 {
        return Err(PyIndexError::new_err(format!("sample index {i} out of range: the source has {len} samples")));
    }
    Ok(j as usize)
}

#[pymethods]
impl Source {
    #[new]
    #[pyo3(signature = (uri, options = "{}"))]
    fn new(py: Python<'_>, uri: String, options: &str) -> PyResult<Self> {
        let s = Source { uri, options: options.to_string(), opened: Mutex::new(None) };
        s.get_src(py)?; // open now so a bad URI fails at construction
        Ok(s)
    }

    fn __getnewargs__(&self) -> (String, String) {
        (self.uri.clone(), self.options.clone())
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.get_src(py)?.len())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("stoker.Source({})", self.get_src(py)?))
    }

    /// `(key, [(field, bytes), ...])` of sample `i`.
    fn get<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyAny>> {
        let src = self.get_src(py)?;
        let i = index(i, src.len())?;
        let s = block_on(py, async move { src.get(i).await })?.map_err(err)?;
        sample_to_py(py, &s)
    }

    /// Several samples, read concurrently (coalesced for tar shards).
    fn get_many<'py>(&self, py: Python<'py>, indices: Vec<i64>) -> PyResult<Bound<'py, PyList>> {
        let src = self.get_src(py)?;
        let idx = indices.iter().map(|&i| index(i, src.len())).collect::<PyResult<Vec<_>>>()?;
        let got = block_on(py, async move { src.get_many(&idx).await })?.map_err(err)?;
        let out = PyList::empty(py);
        for s in &got {
            out.append(sample_to_py(py, s)?)?;
        }
        Ok(out)
    }

    /// Layout, shards, samples and the URI (credentials redacted).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let src = self.get_src(py)?;
        let d = PyDict::new(py);
        d.set_item("uri", src.to_string())?;
        d.set_item("layout", src.info().layout.as_str())?;
        d.set_item("shards", src.info().shards)?;
        d.set_item("samples", src.len())?;
        Ok(d)
    }
}

/// The Rust Loader for one source, built again in a forked child: the one made in the parent
/// spawns its producers on the parent's runtime and reads through the parent's connections,
/// neither of which runs in the child, so using it there would wait forever.
#[pyclass(module = "stoker._stoker")]
struct Loader {
    source: Py<Source>,
    cfg: LoaderConfig,
    /// The loader and the process that built it.
    built: Mutex<(u32, Arc<RsLoader>)>,
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
        let pid = std::process::id();
        let inherited = {
            let built = self.built.lock().unwrap_or_else(|e| e.into_inner());
            if built.0 == pid {
                return Ok(built.1.clone());
            }
            built.1.clone()
        };
        // Not under the lock: building waits with the GIL released and takes it back to check
        // for Ctrl-C, while another thread may hold the GIL waiting for the lock.
        let pending = inherited.resume_epoch().and(inherited.state());
        let fresh = Self::build(py, self.source.get(), self.cfg.clone())?;
        if let Some(state) = pending {
            fresh.load_state(state).map_err(err)?;
        }
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if built.0 != pid {
            *built = (pid, fresh); // else another thread of this process built one first
        }
        Ok(built.1.clone())
    }
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (source, batch_size, shuffle=false, seed=0, drop_last=false, prefetch=4,
                        rank=None, world_size=None, worker=0, num_workers=1, wrap=true,
                        max_bytes_in_flight=1u64<<30, skip_errors=false, decode=None, threads=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: Py<Source>,
        batch_size: usize,
        shuffle: bool,
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
    ) -> PyResult<Self> {
        let mut cfg = LoaderConfig::new(batch_size);
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
        cfg.drop_last = drop_last;
        cfg.prefetch = prefetch;
        cfg.max_bytes_in_flight = max_bytes_in_flight;
        cfg.order = if shuffle { Order::Shuffle { seed } } else { Order::Sequential };
        cfg.partition = match (rank, world_size) {
            (Some(r), Some(w)) => Partition::new(r, w).map_err(|e| err(e.into()))?,
            (None, None) => Partition::from_env().map_err(|e| err(e.into()))?,
            _ => {
                return Err(InvalidInputError::new_err(
                    "give both rank and world_size, or neither (then RANK/WORLD_SIZE)",
                ))
            }
        };
        cfg.worker = worker;
        cfg.num_workers = num_workers;
        cfg.tail = if wrap { Tail::Wrap } else { Tail::Drop };
        if skip_errors {
            cfg.on_error = stoker::loader::ErrorPolicy::Skip;
        }
        let loader = Self::build(py, source.get(), cfg.clone())?;
        Ok(Loader { source, cfg, built: Mutex::new((std::process::id(), loader)) })
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
        Ok(Epoch { stream: Some(loader.epoch(epoch).map_err(err)?), pid: std::process::id() })
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

/// One epoch's batches.
#[pyclass(module = "stoker._stoker")]
struct Epoch {
    stream: Option<EpochStream>,
    /// The process whose runtime produces the batches.
    pid: u32,
}

#[pymethods]
impl Epoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Batch> {
        let Some(stream) = self.stream.as_mut() else { return Err(PyStopIteration::new_err(())) };
        if self.pid != std::process::id() {
            // Its producer ran on the parent's runtime, which does not run here: waiting on it
            // would never end.
            return Err(StokerError::new_err(
                "this epoch was started in the parent process before a fork and cannot continue in the child; \
                 start a new iteration of the loader in this process",
            ));
        }
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
struct Batch {
    batch: Arc<stoker::batch::Batch>,
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
    /// len+1). A decoded column's values are one `[B, *shape]` array of `dtype` (its name is
    /// returned); a raw column's are uint8 bytes back to back and `dtype` is None.
    fn column(&self, name: &str) -> PyResult<(DlPack, DlPack, Option<&'static str>)> {
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
        Ok((
            DlPack { owner: self.batch.clone(), ptr: ptr as *mut c_void, shape: data_shape, code, bits },
            DlPack { owner: self.batch.clone(), ptr: optr as *mut c_void, shape: vec![olen as i64], code: 0, bits: 64 },
            dtype,
        ))
    }

    /// Sample `i`'s value of field `name` as bytes (a copy).
    fn value<'py>(&self, py: Python<'py>, name: &str, i: usize) -> PyResult<Bound<'py, PyBytes>> {
        let col = self.batch.field(name).ok_or_else(|| InvalidInputError::new_err(format!("no field `{name}`")))?;
        let v = col.get(i).ok_or_else(|| PyIndexError::new_err(format!("row {i} out of range")))?;
        Ok(PyBytes::new(py, v))
    }
}

/// The caching ladder of `stoker diagnose` over `uri`: returns the report as text and JSON.
/// `step`, when given, is called once per batch as the consumer (the training step).
#[pyfunction]
#[pyo3(signature = (uri, options, batch_size, prefetch=4, shuffle=false, seed=0, samples=2048, seconds=10.0, step=None))]
#[allow(clippy::too_many_arguments)] // mirrors the Python keyword arguments
fn diagnose(
    py: Python<'_>,
    uri: &str,
    options: &str,
    batch_size: usize,
    prefetch: usize,
    shuffle: bool,
    seed: u64,
    samples: u64,
    seconds: f64,
    step: Option<Py<PyAny>>,
) -> PyResult<(String, String)> {
    use stoker::diagnose::{Consumer, DiagnoseConfig};
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(InvalidInputError::new_err(format!("seconds must be a positive number, not {seconds}")));
    }
    let opts = SourceOptions::from_json(options).map_err(err)?;
    let mut cfg = LoaderConfig::new(batch_size);
    cfg.prefetch = prefetch.max(1);
    if shuffle {
        cfg.order = Order::Shuffle { seed };
    }
    let consumer = step.map(|f| {
        let f = Arc::new(f);
        // Runs on Stoker's threads: each call takes the GIL for the step alone.
        Arc::new(move |_: &stoker::batch::Batch| {
            Python::attach(|py| f.call0(py).map(|_| ()))
                .map_err(|e| stoker::Error::InvalidOption { message: format!("the step raised {e}") })
        }) as Consumer
    });
    let mut dc = DiagnoseConfig::new(cfg, consumer);
    dc.samples = samples;
    dc.max_time = Duration::from_secs_f64(seconds);
    let report = block_on(py, stoker::diagnose::diagnose(uri, opts, dc))?.map_err(err)?;
    let json = serde_json::to_string(&report).map_err(|e| StokerError::new_err(e.to_string()))?;
    Ok((report.to_string(), json))
}

#[pymodule]
fn _stoker(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Source>()?;
    m.add_function(wrap_pyfunction!(diagnose, m)?)?;
    m.add_class::<Loader>()?;
    m.add_class::<Epoch>()?;
    m.add_class::<Batch>()?;
    m.add_class::<DlPack>()?;
    m.add("StokerError", py.get_type::<StokerError>())?;
    m.add("NotFoundError", py.get_type::<NotFoundError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("CorruptDataError", py.get_type::<CorruptDataError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("RemoteError", py.get_type::<RemoteError>())?;
    m.add("CudaUnavailableError", py.get_type::<CudaUnavailableError>())?;
    Ok(())
}
