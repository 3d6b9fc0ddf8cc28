//! Writing: tar shards from Arrow rows (`ShardWriter`, `ShardStream`: the Ray datasink's write tasks),
//! `pack` (any source into tar shards or LMDB), and `index` (a destination's manifest).

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyDict;
use stoker::pack::PackOptions;
use stoker::{Layout, SourceOptions};

use crate::errors::{err, InvalidInputError, StokerError};
use crate::runtime::{block_on, Local};
use crate::source::Source;

/// Writes WebDataset tar shards into one destination (see `stoker::pack::ShardWriter`).
#[pyclass(module = "stoker._stoker", frozen)]
pub(crate) struct ShardWriter {
    dest: String,
    options: String,
    /// Opened by this process, or by the one it was forked from (then opened again here: the
    /// parent's connections belong to the parent's runtime).
    inner: Mutex<Local<stoker::pack::ShardWriter>>,
}

impl ShardWriter {
    /// This process's writer.
    fn writer(&self) -> PyResult<stoker::pack::ShardWriter> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = inner.here() {
            return Ok(w.clone());
        }
        let opts = SourceOptions::from_json(&self.options).map_err(err)?;
        *inner = Local::new(stoker::pack::ShardWriter::open(&self.dest, opts).map_err(err)?);
        Ok(inner.inherited().clone())
    }
}

#[pymethods]
impl ShardWriter {
    #[new]
    #[pyo3(signature = (dest, options = "{}"))]
    fn new(dest: &str, options: &str) -> PyResult<Self> {
        let opts = SourceOptions::from_json(options).map_err(err)?;
        let inner = Mutex::new(Local::new(stoker::pack::ShardWriter::open(dest, opts).map_err(err)?));
        Ok(ShardWriter { dest: dest.to_string(), options: options.to_string(), inner })
    }

    fn __repr__(&self) -> String {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        format!("ShardWriter({:?})", inner.inherited().dest())
    }

    /// Start or resume a job with `settings` (JSON text) recorded in the destination, naming
    /// its files by `prefix`.
    #[pyo3(signature = (settings, prefix, force = false))]
    fn begin(&self, py: Python<'_>, settings: &str, prefix: String, force: bool) -> PyResult<()> {
        let settings: serde_json::Value = serde_json::from_str(settings)
            .map_err(|e| InvalidInputError::new_err(format!("settings must be JSON: {e}")))?;
        let w = self.writer()?;
        block_on(py, async move { w.begin(&settings, &prefix, force).await })?.map_err(err)
    }

    /// End the job whose shards are `written`: stale shards of `prefix` removed, the manifest
    /// built; returns the index report.
    fn finish<'py>(&self, py: Python<'py>, prefix: String, written: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.writer()?;
        let r = block_on(py, async move { w.finish(&prefix, &written).await })?.map_err(err)?;
        index_report(py, r)
    }

    /// Write the token pair `{stem}.bin` / `{stem}.idx` from `docs` (each document's tokens,
    /// little-endian of `dtype`: `uint16` or `int32`); returns what was written.
    fn write_tokens<'py>(
        &self,
        py: Python<'py>,
        stem: String,
        dtype: &str,
        docs: Vec<PyBackedBytes>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let dtype = match dtype {
            "uint16" => stoker::pack::TokenDtype::U16,
            "int32" => stoker::pack::TokenDtype::I32,
            other => {
                return Err(InvalidInputError::new_err(format!(
                    "token_dtype is `uint16` or `int32` (Megatron's types), not `{other}`"
                )))
            }
        };
        let docs: Vec<bytes::Bytes> = docs.into_iter().map(bytes::Bytes::from_owner).collect();
        let w = self.writer()?;
        let done = block_on(py, async move { w.write_tokens(&stem, dtype, &docs).await })?.map_err(err)?;
        written(py, done)
    }

    /// Start writing shard `name` (about `size_hint` bytes; 0 if unknown) one block of rows at
    /// a time: a [`ShardStream`].
    #[pyo3(signature = (name, size_hint = 0))]
    fn shard(&self, py: Python<'_>, name: String, size_hint: u64) -> PyResult<ShardStream> {
        // Made on the runtime, whose requests send a remote shard's parts as it grows.
        let w = self.writer()?;
        let stream = block_on(py, async move { w.shard(&name, size_hint) })?.map_err(err)?;
        Ok(ShardStream { inner: Some(Local::new(stream)) })
    }
}

/// One tar shard being written from Arrow arrays (see `stoker::pack::ShardStream`); nothing
/// is under its name until `finish`, and one dropped unfinished leaves nothing.
#[pyclass(module = "stoker._stoker")]
pub(crate) struct ShardStream {
    /// `None` once finished or given up. Made by this process or, in a forked child, by its
    /// parent: then only the parent may write, finish or give it up (its temporary file and
    /// upload are the parent's), and the child's copy is left undropped.
    inner: Option<Local<stoker::pack::ShardStream>>,
}

impl ShardStream {
    /// The stream, if it is unfinished and this process's.
    fn mine(&mut self) -> PyResult<&mut stoker::pack::ShardStream> {
        let stream = self.inner.as_mut().ok_or_else(|| InvalidInputError::new_err("the shard was already finished"))?;
        stream.here_mut().ok_or_else(|| {
            StokerError::new_err(
                "this shard was started in the parent process before a fork: only that process can write, \
                 finish or abort it; start a new shard in this process",
            )
        })
    }
}

#[pymethods]
impl ShardStream {
    fn __repr__(&self) -> String {
        self.inner
            .as_ref()
            .map_or("ShardStream(finished)".into(), |s| format!("ShardStream({:?})", s.inherited().name()))
    }

    /// The shard's size were it finished now.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.as_ref().map_or(0, |s| s.inherited().bytes())
    }

    /// Samples written so far.
    #[getter]
    fn samples(&self) -> usize {
        self.inner.as_ref().map_or(0, |s| s.inherited().samples())
    }

    /// Write one sample per row: its key from `keys` (an Arrow string array, no nulls) and a
    /// member per column of `columns` (member name, an Arrow binary or string array of the
    /// same length; a null is a member left out). The arrays are read in place (the Arrow C
    /// data interface), with the GIL released.
    fn add(
        &mut self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        columns: Vec<(String, Bound<'_, PyAny>)>,
    ) -> PyResult<()> {
        let keys = import(keys, "__key__")?;
        let columns: Vec<(String, arrow_array::ArrayRef)> =
            columns.into_iter().map(|(n, a)| import(&a, &n).map(|c| (n, c))).collect::<PyResult<_>>()?;
        let stream = self.mine()?;
        // Checked and written with the GIL released. A bad array or a null key is the
        // caller's mistake; a sample refused or a failed write is the writer's error, with
        // its kind.
        let written = py.detach(|| {
            let keys = Column::of(keys, "__key__").map_err(Err)?;
            if matches!(keys, Column::Binary(_) | Column::LargeBinary(_)) {
                return Err(Err("__key__ must be a string column (each row's sample key)".to_string()));
            }
            let columns: Vec<(String, Column)> = columns
                .into_iter()
                .map(|(n, a)| Column::of(a, &n).map(|c| (n, c)))
                .collect::<std::result::Result<_, _>>()
                .map_err(Err)?;
            let rows = keys.len();
            if let Some((name, c)) = columns.iter().find(|(_, c)| c.len() != rows) {
                return Err(Err(format!("column `{name}` has {} rows for {rows} keys", c.len())));
            }
            let mut fields: Vec<(&str, &[u8])> = Vec::with_capacity(columns.len());
            for row in 0..rows {
                let key = keys.text(row).ok_or_else(|| Err(format!("row {row} has no __key__ (null)")))?;
                fields.clear();
                fields.extend(columns.iter().filter_map(|(n, c)| c.bytes(row).map(|v| (n.as_str(), v))));
                stream.add(key, &fields).map_err(Ok)?;
            }
            Ok::<_, Result<stoker::Error, String>>(())
        });
        match written {
            Ok(()) => Ok(()),
            Err(Ok(e)) => Err(err(e)),
            Err(Err(why)) => Err(InvalidInputError::new_err(why)),
        }
    }

    /// Give the shard up: nothing appears under its name (what dropping it does, but now).
    fn abort(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.inner.is_none() {
            return Ok(());
        }
        self.mine()?;
        match self.inner.take().and_then(Local::into_inner) {
            Some(stream) => block_on(py, stream.abort()),
            None => Ok(()),
        }
    }

    /// Publish the shard (or keep an equal one already there) and index it; returns what was
    /// written.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.mine()?;
        let Some(stream) = self.inner.take().and_then(Local::into_inner) else {
            return Err(InvalidInputError::new_err("the shard was already finished"));
        };
        let done = block_on(py, async move { stream.finish().await })?.map_err(err)?;
        written(py, done)
    }
}

/// An Arrow array from Python through the Arrow PyCapsule interface (`__arrow_c_array__`,
/// pyarrow 14 and later), without a copy: its buffers stay the producer's, kept alive by the
/// imported array until it is dropped. Checked by [`Column::of`].
fn import(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<arrow_array::ArrayRef> {
    use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
    use pyo3::types::{PyCapsule, PyCapsuleMethods};
    let bad = |why: String| InvalidInputError::new_err(format!("column `{name}`: {why}"));
    if !obj.hasattr("__arrow_c_array__")? {
        return Err(bad("not an Arrow array (pyarrow 14 or later)".into()));
    }
    let (schema, array): (Bound<'_, PyCapsule>, Bound<'_, PyCapsule>) =
        obj.call_method0("__arrow_c_array__")?.extract()?;
    let schema = schema.pointer_checked(Some(c"arrow_schema"))?.cast::<FFI_ArrowSchema>();
    let array = array.pointer_checked(Some(c"arrow_array"))?.cast::<FFI_ArrowArray>();
    // SAFETY: capsules named as the Arrow PyCapsule interface names them hold an initialised,
    // aligned FFI_ArrowSchema and FFI_ArrowArray, valid while the capsules live (they do, for
    // this call). A released array (no release callback) is refused; a live one is moved out
    // (its capsule then holds a released one, which its destructor skips) and owns its buffers
    // through the producer's release callback. The buffers' sizes are the producer's word, as
    // the C data interface has it: the soundness of what follows rests on a producer that
    // keeps the interface (pyarrow), which `Column::of`'s full validation then checks within.
    let data = unsafe {
        if (*array.as_ptr()).is_released() {
            return Err(bad("a released Arrow array".into()));
        }
        arrow_array::ffi::from_ffi(FFI_ArrowArray::from_raw(array.as_ptr()), schema.as_ref())
    }
    .map_err(|e| bad(format!("cannot import it: {e}")))?;
    Ok(arrow_array::make_array(data))
}

/// A binary or string column of a block, imported by [`import`].
enum Column {
    Binary(arrow_array::BinaryArray),
    LargeBinary(arrow_array::LargeBinaryArray),
    Text(arrow_array::StringArray),
    LargeText(arrow_array::LargeStringArray),
}

impl Column {
    /// The array as a column, checked in full first (offsets in bounds and increasing, text
    /// valid UTF-8: whatever the producer sent), or why it cannot be one.
    fn of(a: arrow_array::ArrayRef, name: &str) -> std::result::Result<Self, String> {
        use arrow_array::Array;
        let bad = |why: String| format!("column `{name}`: {why}");
        a.to_data().validate_full().map_err(|e| bad(format!("an invalid Arrow array: {e}")))?;
        let any = a.as_any();
        if let Some(a) = any.downcast_ref::<arrow_array::BinaryArray>() {
            Ok(Column::Binary(a.clone()))
        } else if let Some(a) = any.downcast_ref::<arrow_array::LargeBinaryArray>() {
            Ok(Column::LargeBinary(a.clone()))
        } else if let Some(a) = any.downcast_ref::<arrow_array::StringArray>() {
            Ok(Column::Text(a.clone()))
        } else if let Some(a) = any.downcast_ref::<arrow_array::LargeStringArray>() {
            Ok(Column::LargeText(a.clone()))
        } else {
            Err(bad(format!("type {}, not binary or string", a.data_type())))
        }
    }

    fn len(&self) -> usize {
        use arrow_array::Array;
        match self {
            Column::Binary(a) => a.len(),
            Column::LargeBinary(a) => a.len(),
            Column::Text(a) => a.len(),
            Column::LargeText(a) => a.len(),
        }
    }

    /// Row `i`'s bytes, `None` for a null.
    fn bytes(&self, i: usize) -> Option<&[u8]> {
        use arrow_array::Array;
        match self {
            Column::Binary(a) => a.is_valid(i).then(|| a.value(i)),
            Column::LargeBinary(a) => a.is_valid(i).then(|| a.value(i)),
            Column::Text(a) => a.is_valid(i).then(|| a.value(i).as_bytes()),
            Column::LargeText(a) => a.is_valid(i).then(|| a.value(i).as_bytes()),
        }
    }

    /// Row `i` as text, `None` for a null or a binary column.
    fn text(&self, i: usize) -> Option<&str> {
        use arrow_array::Array;
        match self {
            Column::Text(a) => a.is_valid(i).then(|| a.value(i)),
            Column::LargeText(a) => a.is_valid(i).then(|| a.value(i)),
            Column::Binary(_) | Column::LargeBinary(_) => None,
        }
    }
}

fn written(py: Python<'_>, done: stoker::pack::ShardWritten) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &done.name)?;
    d.set_item("bytes", done.bytes)?;
    d.set_item("samples", done.samples)?;
    d.set_item("payload_bytes", done.payload_bytes)?;
    d.set_item("kept", done.kept)?;
    Ok(d)
}

/// Build or refresh the shard indexes of `uri` and write its manifest; returns the report.
#[pyfunction]
#[pyo3(signature = (uri, options = "{}"))]
pub(crate) fn index<'py>(py: Python<'py>, uri: String, options: &str) -> PyResult<Bound<'py, PyDict>> {
    let opts = SourceOptions::from_json(options).map_err(err)?;
    let r = block_on(py, async move { stoker::source::index(&uri, opts).await })?.map_err(err)?;
    index_report(py, r)
}

fn index_report(py: Python<'_>, r: stoker::source::IndexReport) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("manifest", r.manifest)?;
    d.set_item("objects", r.objects)?;
    d.set_item("samples", r.samples)?;
    d.set_item("checksums", r.checksums)?;
    Ok(d)
}

/// Pack `source` into `dest` (`stoker::pack::pack`); returns the report.
#[pyfunction]
#[pyo3(signature = (source, dest, layout = "tar", shard_size = None, samples_per_shard = None, prefix = None, group = false, field = None, force = false, jobs = None, dest_options = "{}"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack<'py>(
    py: Python<'py>,
    source: &Source,
    dest: String,
    layout: &str,
    shard_size: Option<u64>,
    samples_per_shard: Option<usize>,
    prefix: Option<String>,
    group: bool,
    field: Option<String>,
    force: bool,
    jobs: Option<usize>,
    dest_options: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let layout = match layout {
        "tar" => Layout::Tar,
        "lmdb" => Layout::Lmdb,
        other => return Err(InvalidInputError::new_err(format!("pack writes layout `tar` or `lmdb`, not `{other}`"))),
    };
    let mut opts = PackOptions::new(layout);
    opts.shard_size = shard_size.unwrap_or(opts.shard_size);
    opts.samples_per_shard = samples_per_shard;
    opts.prefix = prefix.unwrap_or(opts.prefix);
    opts.group = group;
    opts.field = field;
    opts.force = force;
    opts.jobs = jobs.unwrap_or(opts.jobs).max(1);
    opts.dest_options = SourceOptions::from_json(dest_options).map_err(err)?;
    let src = source.get_src(py)?;
    // `pack`'s future is not `Send` (a higher-ranked lifetime rustc cannot prove), so it runs
    // on a thread of its own with a runtime of its own, waited on with the GIL released.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("stoker-pack".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let r = match rt {
                Ok(rt) => rt.block_on(stoker::pack::pack(src, &dest, &opts, &())),
                Err(e) => Err(stoker::Error::Io { path: "the pack runtime".into(), source: e }),
            };
            let _ = tx.send(r);
        })
        .map_err(|e| StokerError::new_err(format!("cannot start the pack thread: {e}")))?;
    let rx = std::sync::Mutex::new(rx); // `detach` needs a `Sync` closure
    let r = loop {
        match py
            .detach(|| rx.lock().unwrap_or_else(|e| e.into_inner()).recv_timeout(std::time::Duration::from_millis(100)))
        {
            Ok(r) => break r.map_err(err)?,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(StokerError::new_err("the pack thread ended without an answer"))
            }
        }
    };
    let d = PyDict::new(py);
    d.set_item("dest", r.dest)?;
    d.set_item("samples", r.samples)?;
    d.set_item("shards", r.shards)?;
    d.set_item("payload_bytes", r.payload_bytes)?;
    d.set_item("written_bytes", r.written_bytes)?;
    d.set_item("resumed_shards", r.resumed_shards)?;
    d.set_item("seconds", r.seconds)?;
    Ok(d)
}

/// Write the demo dataset under `dir` (`stoker::demo::write`); returns the paths written.
#[pyfunction]
#[pyo3(signature = (dir, images = 512, documents = 1000))]
pub(crate) fn demo<'py>(
    py: Python<'py>,
    dir: std::path::PathBuf,
    images: usize,
    documents: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = stoker::demo::DemoOptions { images, documents };
    let r = py.detach(|| stoker::demo::write(&dir, &opts)).map_err(err)?;
    let d = PyDict::new(py);
    d.set_item("images", r.images)?;
    d.set_item("text", r.text)?;
    d.set_item("tokenizer", r.tokenizer)?;
    d.set_item("bytes", r.bytes)?;
    Ok(d)
}
