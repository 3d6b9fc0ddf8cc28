//! `TokenLoader`: packed language-model batches from a token source (see `stoker::tokens`).

use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use stoker::tokens::{
    IdType, PackConfig, Packing, TextInput, TextTokenizer, TokenEpoch as RsEpoch, TokenLoader as RsLoader, TokenState,
};

use crate::errors::{err, InvalidInputError, StokerError};
use crate::loader::{partition, Batch};
use crate::runtime::{block_on, runtime, Local};
use crate::source::Source;

/// The Rust token loader, built again in a forked child (the parent's runs on the parent's
/// runtime), going on from where the parent's stands (a state loaded there and not yet used,
/// the mix's weights in force).
#[pyclass(module = "stoker._stoker")]
pub(crate) struct TokenLoader {
    source: Py<Source>,
    /// For a text source, the tokenizer (loaded once); the field holding the documents; and
    /// whether bad documents are packed empty (`skip_errors`).
    text: TextInput,
    cfg: PackConfig,
    /// The loader, built by this process or the one it was forked from.
    built: Mutex<Local<Arc<RsLoader>>>,
}

impl TokenLoader {
    fn build(py: Python<'_>, source: &Source, text: &TextInput, cfg: PackConfig) -> PyResult<Arc<RsLoader>> {
        let src = source.get_src(py)?;
        let text = text.clone();
        // Text is tokenized once into the user cache, arrays of ids copied there (a mix's
        // sources each on their own).
        Ok(Arc::new(block_on(py, async move { RsLoader::open(src, &text, cfg).await })?.map_err(err)?))
    }

    fn get(&self, py: Python<'_>) -> PyResult<Arc<RsLoader>> {
        let inherited = {
            let built = self.built.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(l) = built.here() {
                return Ok(l.clone());
            }
            built.inherited().clone()
        };
        let fresh = Self::build(py, self.source.get(), &self.text, self.cfg.clone())?;
        // The parent's books (a state it has not used yet, the weights in force), read without
        // waiting: a parent thread may have held their lock at the fork. Then this starts
        // afresh, which is said.
        if !fresh.adopt_books_of(&inherited) {
            py.import("warnings")?.call_method1(
                "warn",
                ("stoker.TokenLoader: the parent process was mid-batch when this process forked; its resume state \
                  and mix weights were not taken over, and this loader starts afresh",),
            )?;
        }
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if built.here().is_none() {
            *built = Local::new(fresh);
        }
        Ok(built.inherited().clone())
    }
}

#[pymethods]
impl TokenLoader {
    #[new]
    #[pyo3(signature = (source, seq_len, global_batch, labels=false, shuffle=None, seed=0, shuffle_window=None,
                        bos=None, eos=None, pad_id=0, pad_tail=false, per_document=false, int64=false,
                        ids_dtype=None, mask_boundaries=false, prefetch=4, rank=None, world_size=None, tokenizer=None,
                        field=None, skip_errors=false, columns=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        source: Py<Source>,
        seq_len: usize,
        global_batch: usize,
        labels: bool,
        shuffle: Option<&Bound<'_, PyAny>>,
        seed: u64,
        shuffle_window: Option<usize>,
        bos: Option<&Bound<'_, PyAny>>,
        eos: Option<&Bound<'_, PyAny>>,
        pad_id: i64,
        pad_tail: bool,
        per_document: bool,
        int64: bool,
        ids_dtype: Option<String>,
        mask_boundaries: bool,
        prefetch: usize,
        rank: Option<u64>,
        world_size: Option<u64>,
        tokenizer: Option<std::path::PathBuf>,
        field: Option<String>,
        skip_errors: bool,
        columns: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let vocab = match &tokenizer {
            Some(p) => Some(Arc::new(TextTokenizer::from_file(p).map_err(err)?)),
            None => None,
        };
        // A special token by its text (`eos="<|endoftext|>"`) needs the tokenizer to be an id.
        let id = |what: &str, v: Option<&Bound<'_, PyAny>>| -> PyResult<Option<i64>> {
            let Some(v) = v else { return Ok(None) };
            if let Ok(i) = v.extract::<i64>() {
                return Ok(Some(i));
            }
            let t: String =
                v.extract().map_err(|_| InvalidInputError::new_err(format!("{what} must be an id or a token")))?;
            match &vocab {
                Some(tok) => tok
                    .token_id(&t)
                    .map(|i| Some(i64::from(i)))
                    .ok_or_else(|| InvalidInputError::new_err(format!("{what}={t:?} is not a token of the tokenizer"))),
                None => Err(InvalidInputError::new_err(format!("{what}={t:?}: a token by its text needs tokenizer="))),
            }
        };
        let (bos, eos) = (id("bos", bos)?, id("eos", eos)?);
        // An id past the vocabulary indexes past the model's embedding: refused here, not in
        // the training step.
        if let Some(tok) = &vocab {
            let unknown = |t: i64| u32::try_from(t).map_or(t >= 0, |t| !tok.has_id(t));
            let found = [("bos", bos), ("eos", eos)].into_iter().find_map(|(w, t)| Some((w, t?)));
            if let Some((what, t)) = found.filter(|&(_, t)| unknown(t)) {
                return Err(InvalidInputError::new_err(format!("{what}={t} is no token of the tokenizer")));
            }
        }
        let mut cfg = PackConfig::new(seq_len, global_batch);
        cfg.labels = labels;
        cfg.order = crate::order::order(shuffle, shuffle_window, seed)?;
        cfg.bos = bos;
        cfg.eos = eos;
        cfg.pad_id = pad_id;
        cfg.pad_tail = pad_tail;
        cfg.packing = if per_document { Packing::PerDocument } else { Packing::Concat };
        cfg.ids = match (ids_dtype.as_deref(), int64) {
            (None, false) => IdType::Int32,
            (None, true) | (Some("int64"), true) => IdType::Int64,
            (Some(name), false) => IdType::from_name(name).map_err(err)?,
            (Some(name), true) => {
                return Err(InvalidInputError::new_err(format!(
                    "int64=True and ids_dtype={name:?} disagree: give ids_dtype alone"
                )))
            }
        };
        cfg.mask_boundaries = mask_boundaries;
        if let Some(names) = &columns {
            cfg.columns = stoker::tokens::TokenColumns::from_names(names).map_err(err)?;
        }
        cfg.prefetch = prefetch;
        cfg.partition = partition(rank, world_size)?;
        let text = TextInput { tokenizer: vocab, field, skip_errors };
        let loader = Self::build(py, source.get(), &text, cfg.clone())?;
        Ok(TokenLoader { source, text, cfg, built: Mutex::new(Local::new(loader)) })
    }

    /// Global batches in `epoch` (this rank gets its rows of each).
    fn batches(&self, py: Python<'_>, epoch: u64) -> PyResult<u64> {
        let loader = self.get(py)?;
        py.detach(|| loader.batches(epoch)).map_err(err)
    }

    /// Tokens in `epoch`'s stream (documents with their BOS and EOS).
    fn tokens(&self, py: Python<'_>, epoch: u64) -> PyResult<u64> {
        let loader = self.get(py)?;
        py.detach(|| loader.tokens(epoch)).map_err(err)
    }

    /// Start `epoch` (from a loaded state's batch when it is for this epoch).
    fn epoch(&self, py: Python<'_>, epoch: u64) -> PyResult<TokenEpoch> {
        let loader = self.get(py)?;
        let rt = runtime()?;
        let _guard = rt.enter();
        let e = py.detach(|| loader.epoch(epoch)).map_err(err)?;
        Ok(TokenEpoch { epoch: Some(Local::new(e)) })
    }

    /// The resume state as JSON: the epoch and the next global batch, for any world size.
    fn state(&self, py: Python<'_>) -> PyResult<String> {
        serde_json::to_string(&self.get(py)?.state()).map_err(|e| StokerError::new_err(e.to_string()))
    }

    /// Resume from `state()` JSON on the next `epoch()` of its epoch.
    fn load_state(&self, py: Python<'_>, state: &str) -> PyResult<()> {
        let s: TokenState = serde_json::from_str(state)
            .map_err(|e| InvalidInputError::new_err(format!("bad token loader state: {e}")))?;
        self.get(py)?.load_state(s).map_err(err)
    }

    /// Statistics as a dict; for a mix, `source_tokens`: tokens this rank read per source.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let loader = self.get(py)?;
        let mut v = serde_json::to_value(loader.stats()).map_err(|e| StokerError::new_err(e.to_string()))?;
        if let Some(o) = v.as_object_mut() {
            let per: serde_json::Map<String, serde_json::Value> =
                loader.source_tokens().into_iter().map(|(n, t)| (n, t.into())).collect();
            o.insert("source_tokens".into(), per.into());
        }
        py.import("json")?.call_method1("loads", (v.to_string(),))
    }

    /// A mix's new weights, from the next global batch (see `stoker::tokens::TokenMix`).
    fn set_weights(&self, py: Python<'_>, weights: Vec<f64>) -> PyResult<()> {
        self.get(py)?.set_weights(&weights).map(drop).map_err(err)
    }
}

/// One epoch's packed batches.
#[pyclass(module = "stoker._stoker")]
pub(crate) struct TokenEpoch {
    /// Its batches, produced on the runtime of the process that started it.
    epoch: Option<Local<RsEpoch>>,
}

#[pymethods]
impl TokenEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Batch> {
        let Some(e) = self.epoch.as_mut() else { return Err(PyStopIteration::new_err(())) };
        let Some(e) = e.here_mut() else {
            return Err(StokerError::new_err(
                "this epoch was started in the parent process before a fork and cannot continue in the child; \
                 start a new iteration of the loader in this process",
            ));
        };
        // A batch already handed over is taken as is: no wait, no GIL given back (an 8-row
        // batch of 2,048 tokens is built in about 10 µs; the wait's machinery costs a few).
        let item = match e.try_next_batch() {
            Some(item) => item,
            None => block_on(py, e.next_batch())?,
        };
        match item {
            Some(Ok(b)) => Ok(Batch::new(b)),
            Some(Err(e)) => Err(err(e)),
            None => {
                self.epoch = None;
                Err(PyStopIteration::new_err(()))
            }
        }
    }
}
