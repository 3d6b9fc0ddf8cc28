//! `Source`: an opened source, reopened in each process that uses it.

use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stoker::{DynSampleSource, SourceOptions};

use crate::errors::{err, StokerError};
use crate::runtime::{block_on, Local};

/// An opened source, reopened in each process that uses it.
///
/// It holds the URI and options as given, credentials included, and shows neither: `repr`
/// is the source's redacted form, and Python sees no attribute of it. Pickling
/// (`__getnewargs__`) carries them, for the process that reopens it.
#[pyclass(module = "stoker._stoker", frozen)]
pub(crate) struct Source {
    uri: String,
    options: String,
    /// A listing snapshot to open from instead of listing (`stoker::source::open_with_listing`).
    listing: Option<Vec<u8>>,
    /// Opened by this process, or by the one this was forked from (then opened again here).
    opened: Mutex<Option<Local<Arc<DynSampleSource>>>>,
}

impl Source {
    pub(crate) fn get_src(&self, py: Python<'_>) -> PyResult<Arc<DynSampleSource>> {
        if let Some(src) = self.opened.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(Local::here) {
            return Ok(src.clone());
        }
        let opts = SourceOptions::from_json(&self.options).map_err(err)?;
        let uri = self.uri.clone();
        let listing = self.listing.clone();
        let src = block_on(py, async move {
            match listing {
                Some(l) => stoker::source::open_with_listing(&uri, opts, &l).await,
                None => stoker::open(&uri, opts).await,
            }
        })?
        .map_err(err)?;
        *self.opened.lock().unwrap_or_else(|e| e.into_inner()) = Some(Local::new(src.clone()));
        Ok(src)
    }
}

/// `data` as Python `bytes`, or Python's MemoryError when it cannot allocate them
/// (`PyBytes::new` panics then, and a panic reaches Python as an unexplained PanicException).
pub(crate) fn py_bytes<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let len = pyo3::ffi::Py_ssize_t::try_from(data.len())
        .map_err(|_| pyo3::exceptions::PyMemoryError::new_err("a value larger than Python's bytes can hold"))?;
    // SAFETY: PyBytes_FromStringAndSize copies `len` bytes from `data`, a live slice of that
    // length, and returns a new reference or null with Python's error set, which
    // from_owned_ptr_or_err turns into that error.
    unsafe {
        let ptr = pyo3::ffi::PyBytes_FromStringAndSize(data.as_ptr().cast(), len);
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked())
    }
}

fn sample_to_py<'py>(py: Python<'py>, s: &stoker::Sample) -> PyResult<Bound<'py, PyAny>> {
    let fields = PyList::empty(py);
    for f in &s.fields {
        fields.append((f.name.as_ref(), py_bytes(py, &f.data)?))?;
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
    #[pyo3(signature = (uri, options = "{}", listing = None))]
    fn new(py: Python<'_>, uri: String, options: &str, listing: Option<Vec<u8>>) -> PyResult<Self> {
        let s = Source { uri, options: options.to_string(), listing, opened: Mutex::new(None) };
        s.get_src(py)?; // open now so a bad URI fails at construction
        Ok(s)
    }

    /// Open `uri` for a read split among processes (`stoker::loader::list_for_tasks`): its
    /// samples, the index of each shard's first sample, and the listing snapshot (`None`
    /// where opening lists nothing) for `Source(uri, options, listing)` in those processes.
    #[staticmethod]
    #[pyo3(signature = (uri, options = "{}"))]
    fn list_for_tasks<'py>(
        py: Python<'py>,
        uri: String,
        options: &str,
    ) -> PyResult<(usize, Vec<u64>, Option<Bound<'py, PyBytes>>)> {
        let opts = SourceOptions::from_json(options).map_err(err)?;
        let listed = block_on(py, async move { stoker::loader::list_for_tasks(&uri, opts).await })?.map_err(err)?;
        let bytes = listed.snapshot.as_deref().map(|b| py_bytes(py, b)).transpose()?;
        Ok((listed.samples, listed.shard_starts, bytes))
    }

    /// The parts of listing `snapshot` that readers of the sample runs `spans` need
    /// (`stoker::source::snapshot_spans`): for the `objects` layout, one snapshot per run
    /// holding only that run's objects, its first sample numbered 0; `None` for other layouts
    /// (their readers take the whole snapshot).
    #[staticmethod]
    fn snapshot_spans<'py>(
        py: Python<'py>,
        snapshot: &[u8],
        spans: Vec<(usize, usize)>,
    ) -> PyResult<Option<Vec<Bound<'py, PyBytes>>>> {
        let spans: Vec<std::ops::Range<usize>> = spans.into_iter().map(|(a, b)| a..b).collect();
        let parts = py.detach(|| stoker::source::snapshot_spans(snapshot, &spans)).map_err(err)?;
        parts.map(|parts| parts.iter().map(|p| py_bytes(py, p)).collect()).transpose()
    }

    /// The URI and options, credentials included (and the listing snapshot, if any): what a
    /// process unpickling this opens.
    fn __getnewargs__(&self) -> (String, String, Option<Vec<u8>>) {
        (self.uri.clone(), self.options.clone(), self.listing.clone())
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

    /// Damage stepped over when the source was opened under `on_damage=skip`, as a JSON
    /// list (shard, cause, byte range, keys around it, samples lost, reason, and `text`: one
    /// line saying all that).
    fn damage_json(&self, py: Python<'_>) -> PyResult<String> {
        let src = self.get_src(py)?;
        let with_text = |d: &stoker::stats::Damage| -> serde_json::Result<serde_json::Value> {
            let mut v = serde_json::to_value(d)?;
            if let Some(o) = v.as_object_mut() {
                // The same one-line description the CLI prints.
                o.insert("text".into(), d.to_string().into());
            }
            Ok(v)
        };
        let all = src.damage().iter().map(with_text).collect::<serde_json::Result<Vec<_>>>();
        all.and_then(|v| serde_json::to_string(&v)).map_err(|e| StokerError::new_err(e.to_string()))
    }

    /// Layout, shards, samples and the URI (credentials redacted).
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let src = self.get_src(py)?;
        let d = PyDict::new(py);
        d.set_item("uri", src.to_string())?;
        d.set_item("layout", &*src.info().layout)?;
        d.set_item("shards", src.info().shards)?;
        d.set_item("samples", src.len())?;
        Ok(d)
    }
}
