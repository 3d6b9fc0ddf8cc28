//! Writing: tar shards from rows in hand (`ShardWriter`, the Ray datasink's write tasks),
//! `pack` (any source into tar shards or LMDB), and `index` (a destination's manifest).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyDict;
use stoker::pack::PackOptions;
use stoker::{Field, Layout, Sample, SourceOptions};

use crate::errors::{err, InvalidInputError, StokerError};
use crate::runtime::block_on;
use crate::source::Source;

/// Writes WebDataset tar shards into one destination (see `stoker::pack::ShardWriter`).
#[pyclass(module = "stoker._stoker", frozen)]
pub(crate) struct ShardWriter {
    inner: stoker::pack::ShardWriter,
}

#[pymethods]
impl ShardWriter {
    #[new]
    #[pyo3(signature = (dest, options = "{}"))]
    fn new(dest: &str, options: &str) -> PyResult<Self> {
        let opts = SourceOptions::from_json(options).map_err(err)?;
        Ok(ShardWriter { inner: stoker::pack::ShardWriter::open(dest, opts).map_err(err)? })
    }

    fn __repr__(&self) -> String {
        format!("ShardWriter({:?})", self.inner.dest())
    }

    /// Start or resume a job with `settings` (JSON text) recorded in the destination, naming
    /// its files by `prefix`.
    #[pyo3(signature = (settings, prefix, force = false))]
    fn begin(&self, py: Python<'_>, settings: &str, prefix: String, force: bool) -> PyResult<()> {
        let settings: serde_json::Value = serde_json::from_str(settings)
            .map_err(|e| InvalidInputError::new_err(format!("settings must be JSON: {e}")))?;
        let w = self.inner.clone();
        block_on(py, async move { w.begin(&settings, &prefix, force).await })?.map_err(err)
    }

    /// End the job whose shards are `written`: stale shards of `prefix` removed, the manifest
    /// built; returns the index report.
    fn finish<'py>(&self, py: Python<'py>, prefix: String, written: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.inner.clone();
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
        let w = self.inner.clone();
        let done = block_on(py, async move { w.write_tokens(&stem, dtype, &docs).await })?.map_err(err)?;
        written(py, done)
    }

    /// Write shard `name` from `keys` and `columns` (field name, one value per key, `None`
    /// where a sample lacks the field); returns what was written.
    fn write<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        keys: Vec<String>,
        columns: Vec<(String, Vec<Option<PyBackedBytes>>)>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if let Some((field, values)) = columns.iter().find(|(_, v)| v.len() != keys.len()) {
            return Err(InvalidInputError::new_err(format!(
                "column `{field}` has {} values for {} keys",
                values.len(),
                keys.len()
            )));
        }
        let names: Vec<Arc<str>> = columns.iter().map(|(n, _)| Arc::from(n.as_str())).collect();
        let mut columns: Vec<std::vec::IntoIter<Option<PyBackedBytes>>> =
            columns.into_iter().map(|(_, v)| v.into_iter()).collect();
        let samples: Vec<Sample> = keys
            .into_iter()
            .map(|key| {
                let fields = names
                    .iter()
                    .zip(columns.iter_mut())
                    .filter_map(|(n, c)| {
                        c.next().flatten().map(|v| Field { name: n.clone(), data: bytes::Bytes::from_owner(v) })
                    })
                    .collect();
                Sample { key, fields }
            })
            .collect();
        let w = self.inner.clone();
        let name = name.to_string();
        let done = block_on(py, async move { w.write(&name, &samples).await })?.map_err(err)?;
        written(py, done)
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
