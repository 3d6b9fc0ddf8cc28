//! `diagnose`: the caching ladder with a Python training step as the consumer.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use stoker::loader::LoaderConfig;
use stoker::SourceOptions;

use crate::errors::{err, InvalidInputError, StokerError};
use crate::runtime::block_on;

/// The caching ladder of `stoker diagnose` over `uri`: returns the report as text and JSON.
/// `step`, when given, is called once per batch as the consumer (the training step).
#[pyfunction]
#[pyo3(signature = (uri, options, batch_size, prefetch=4, shuffle=None, seed=0, samples=2048, seconds=10.0, step=None, decode=None, shuffle_window=None))]
#[allow(clippy::too_many_arguments)] // mirrors the Python keyword arguments
pub(crate) fn diagnose(
    py: Python<'_>,
    uri: &str,
    options: &str,
    batch_size: usize,
    prefetch: usize,
    shuffle: Option<&Bound<'_, PyAny>>,
    seed: u64,
    samples: u64,
    seconds: f64,
    step: Option<Py<PyAny>>,
    decode: Option<&str>,
    shuffle_window: Option<usize>,
) -> PyResult<(String, String)> {
    use stoker::diagnose::{Consumer, DiagnoseConfig};
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(InvalidInputError::new_err(format!("seconds must be a positive number, not {seconds}")));
    }
    let opts = SourceOptions::from_json(options).map_err(err)?;
    let mut cfg = LoaderConfig::new(batch_size);
    cfg.prefetch = prefetch.max(1);
    cfg.order = crate::order::order(shuffle, shuffle_window, seed)?;
    if let Some(spec) = decode {
        cfg.decode = Some(stoker::decode::DecodeSpec::from_json(spec).map_err(err)?);
        cfg.augment_seed = seed;
    }
    let consumer = step.map(|f| {
        let f = Arc::new(f);
        // Runs on Stoker's threads: each call takes the GIL for the step alone.
        Arc::new(move |_: &stoker::batch::Batch| {
            Python::attach(|py| f.call0(py).map(|_| ())).map_err(|e| stoker::Error::callback("the step", e))
        }) as Consumer
    });
    let mut dc = DiagnoseConfig::new(cfg, consumer);
    dc.samples = samples;
    dc.max_time = Duration::from_secs_f64(seconds);
    let report = block_on(py, stoker::diagnose::diagnose(uri, opts, dc))?.map_err(err)?;
    let json = serde_json::to_string(&report).map_err(|e| StokerError::new_err(e.to_string()))?;
    Ok((report.to_string(), json))
}
