//! The token loader: this rank's rows of every global batch, read ahead, in order, with a
//! resume state that does not depend on the world size.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::mpsc;

use super::build::Columns;
use super::job::Job;
use super::mix::{MixPart, Segments, SourceDocs, TokenMix};
use super::plan::EpochPlan;
use super::produce::{self, Producers};
use super::state::{DataTokens, TokenState, TokenStream};
use super::{tokenized, PackConfig, TextTokenizer, TokenEpoch};
use crate::batch::BatchPool;
use crate::error::{panic_message, Error, Result};
use crate::source::{DynSampleSource, TokenDocs};
use crate::stats::{Stats, StatsSnapshot};

/// How a source that does not hold token documents becomes them ([`TokenLoader::open`]).
#[derive(Clone, Debug, Default)]
pub struct TextInput {
    /// The tokenizer for text; without it a source must hold arrays of ids.
    pub tokenizer: Option<Arc<TextTokenizer>>,
    /// The field holding the text or the ids, when samples have several.
    pub field: Option<String>,
    /// Write a document that cannot be read or tokenized empty, with a warning, instead of
    /// failing ([`super::TokenizeOptions::skip_errors`]).
    pub skip_errors: bool,
}

/// An epoch planned: its number, the mixture weights it was planned under, the plan.
type Planned = (u64, Box<Segments>, Arc<EpochPlan>);
/// An epoch being planned ahead: its number, weights, and the thread making the plan.
type PlannedAhead = (u64, Box<Segments>, std::thread::JoinHandle<Result<Arc<EpochPlan>>>);

/// Packs a token source's documents into training batches (see [`crate::tokens`]).
pub struct TokenLoader {
    /// The source opened, for its damage report; `None` for a mixture built from parts.
    source: Option<Arc<DynSampleSource>>,
    docs: Arc<dyn TokenDocs>,
    mix: Option<Arc<TokenMix>>,
    /// Tokens this rank read per mixture source.
    source_tokens: Arc<Vec<AtomicU64>>,
    cfg: PackConfig,
    cols: Arc<Columns>,
    pool: BatchPool,
    /// How local batches are built: made once, the machine's cores looked up with it.
    shape: produce::Shape,
    stats: Arc<Stats>,
    /// The last epoch planned, under which weights, and its plan.
    plan: Mutex<Option<Planned>>,
    /// The next epoch's plan, being made on a thread of its own while this epoch runs.
    ahead: Mutex<Option<PlannedAhead>>,
    progress: Arc<Mutex<(TokenState, Option<TokenState>)>>,
    /// See [`TokenLoader::data_tokens`].
    data_tokens: Mutex<DataTokens>,
    runtime: tokio::runtime::Handle,
    _owned: Option<tokio::runtime::Runtime>,
}

impl TokenLoader {
    /// A loader over `source`, which must hold token documents
    /// ([`crate::SampleSource::as_tokens`]). Uses the current tokio runtime, or starts its own.
    ///
    /// A mix (`stoker::open` of a mix whose sources all hold tokens) is weighted by tokens
    /// ([`TokenMix`]).
    pub fn new(source: Arc<DynSampleSource>, cfg: PackConfig) -> Result<Self> {
        if let Some(m) = source.as_mix() {
            let weights = m.weights();
            let parts = m
                .names()
                .zip(m.sources())
                .zip(weights)
                .map(|((name, s), weight)| {
                    Ok(MixPart { name: name.to_string(), docs: Arc::new(SourceDocs::new(s.clone())?), weight })
                })
                .collect::<Result<Vec<_>>>()?;
            return Self::build(Some(source.clone()), None, Some(Arc::new(TokenMix::new(parts)?)), cfg);
        }
        let docs: Arc<dyn TokenDocs> = Arc::new(SourceDocs::new(source.clone())?);
        Self::build(Some(source), Some(docs), None, cfg)
    }

    /// A loader over any source Stoker opens: token documents as they are; text tokenized
    /// once, and arrays of ids copied once, into `$STOKER_CACHE_DIR/tokens` ([`tokenized`],
    /// reused by later runs); a mix's sources each so, the mix weighted by tokens.
    pub async fn open(source: Arc<DynSampleSource>, text: &TextInput, cfg: PackConfig) -> Result<Self> {
        Self::open_boxed(source, text, cfg).await
    }

    /// [`open`](Self::open), compiled here (see the note at the crate's `pub use`s).
    fn open_boxed(
        source: Arc<DynSampleSource>,
        text: &TextInput,
        cfg: PackConfig,
    ) -> futures::future::BoxFuture<'_, Result<Self>> {
        use futures::FutureExt;
        Self::open_here(source, text, cfg).boxed()
    }

    async fn open_here(source: Arc<DynSampleSource>, text: &TextInput, cfg: PackConfig) -> Result<Self> {
        // Text of a vocabulary past uint16 ids would fail at the first large id, naming the
        // token cache's file: said now, naming the tokenizer.
        if let Some(tok) =
            text.tokenizer.as_ref().filter(|t| cfg.ids == super::IdType::Uint16 && t.vocab_size() > 1 << 16)
        {
            return Err(Error::invalid_option(format!(
                "the tokenizer {} has {} tokens, more than uint16 ids hold (65,536): ask for int32 ids",
                tok.name(),
                tok.vocab_size()
            )));
        }
        let cache = crate::SourceOptions::tokens_cache_dir();
        let tokens = |s: Arc<DynSampleSource>| {
            let (tok, field, cache) = (text.tokenizer.clone(), text.field.clone(), cache.clone());
            async move {
                match s.as_tokens().is_some() {
                    true => Ok(s),
                    false => tokenized(s, tok, field, &cache, text.skip_errors).await,
                }
            }
        };
        let Some(m) = source.as_mix() else { return Self::new(tokens(source).await?, cfg) };
        let mut parts = Vec::new();
        for ((name, s), weight) in m.names().zip(m.sources()).zip(m.weights()) {
            let docs = Arc::new(SourceDocs::new(tokens(s.clone()).await?)?);
            parts.push(MixPart { name: name.to_string(), docs, weight });
        }
        Self::from_mix(TokenMix::new(parts)?, cfg)
    }

    /// A loader over a mixture of token corpora, weighted by tokens.
    pub fn from_mix(mix: TokenMix, cfg: PackConfig) -> Result<Self> {
        Self::build(None, None, Some(Arc::new(mix)), cfg)
    }

    fn build(
        source: Option<Arc<DynSampleSource>>,
        docs: Option<Arc<dyn TokenDocs>>,
        mix: Option<Arc<TokenMix>>,
        cfg: PackConfig,
    ) -> Result<Self> {
        cfg.check()?;
        let docs: Arc<dyn TokenDocs> = match (&mix, docs) {
            (Some(m), _) => m.clone(),
            (None, Some(d)) => d,
            (None, None) => return Err(Error::internal("a token loader with no documents")),
        };
        let documents = docs.documents();
        if documents == 0 {
            // A training loop over nothing would end at once without a word.
            return Err(Error::Empty { uri: docs.to_string(), reason: "it holds no token documents".into() });
        }
        let weights = mix.as_ref().map_or(Vec::new(), |m| vec![(0, m.weights())]);
        let sources = mix.as_ref().map_or(0, |m| m.names().len());
        let (runtime, owned) = match tokio::runtime::Handle::try_current() {
            Ok(h) => (h, None),
            Err(_) => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("stoker-tokens")
                    .build()
                    .map_err(|e| Error::resource("the token loader's tokio runtime", e))?;
                (rt.handle().clone(), Some(rt))
            }
        };
        let state = TokenState {
            epoch: 0,
            batch: 0,
            documents,
            seq_len: cfg.seq_len,
            global_batch: cfg.global_batch,
            weights,
            stream: Some(TokenStream::of(&cfg)),
            tokens: None,
            sources: mix.as_ref().map(|m| m.names()),
        };
        let data_tokens = Mutex::new(DataTokens::start(&docs));
        let shape = produce::Shape::of(&cfg);
        Ok(TokenLoader {
            docs,
            mix,
            source_tokens: Arc::new((0..sources).map(|_| AtomicU64::new(0)).collect()),
            cols: Arc::new(Columns::new(&cfg)),
            // The groups in flight, the consumer's, and the batches it holds.
            pool: BatchPool::new(shape.batches_kept(cfg.prefetch)),
            shape,
            stats: Arc::new(Stats::default()),
            plan: Mutex::new(None),
            ahead: Mutex::new(None),
            progress: Arc::new(Mutex::new((state, None))),
            data_tokens,
            source,
            cfg,
            runtime,
            _owned: owned,
        })
    }

    /// Tokens in all the documents (see [`TokenState::tokens`]): one pass over their lengths,
    /// made once, on a thread of its own started with the loader (a billion documents take
    /// seconds), waited for here when it has not ended.
    fn data_tokens(&self) -> u64 {
        self.data_tokens.lock().unwrap_or_else(|e| e.into_inner()).get(&*self.docs)
    }

    /// Epochs whose producers still run or wait (each holds the loader's columns).
    #[cfg(test)]
    pub(super) fn epochs_alive(&self) -> usize {
        Arc::strong_count(&self.cols) - 1
    }

    /// The configuration in use.
    pub fn config(&self) -> &PackConfig {
        &self.cfg
    }

    /// The plan of `epoch`, made once (a pass over the document lengths).
    fn plan(&self, epoch: u64) -> Result<Arc<EpochPlan>> {
        let segments = self.segments(epoch);
        let mut p = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((e, s, plan)) = &*p {
            if *e == epoch && **s == *segments {
                return Ok(plan.clone());
            }
        }
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        let made = match ahead.take() {
            Some((e, s, made)) if e == epoch && *s == *segments => Some(made),
            // Planned under weights changed since: dropped (its thread ends on its own).
            Some((e, _, _)) if e == epoch => None,
            // Another epoch's (`batches()` of some other epoch was asked): kept for its epoch.
            other => {
                *ahead = other;
                None
            }
        };
        drop(ahead);
        let plan = match made {
            Some(made) => made.join().unwrap_or_else(|panic| {
                Err(Error::internal(format!("planning epoch {epoch}: {}", panic_message(panic))))
            })?,
            None => {
                let mix = self.mix.as_deref().map(|m| (m, segments.as_slice()));
                Arc::new(EpochPlan::new(&*self.docs, &self.cfg, epoch, mix)?)
            }
        };
        *p = Some((epoch, segments.into_boxed_slice(), plan.clone()));
        Ok(plan)
    }

    /// Start planning `epoch` on a thread of its own, so the pass over every document's length
    /// (a permutation step each when shuffled) is done while the epoch before it runs rather
    /// than between the two. One source only: a mixture's plan holds its whole document order,
    /// which two at once would double.
    fn plan_ahead(&self, epoch: u64) {
        if self.mix.is_some() {
            return;
        }
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        if ahead.as_ref().is_some_and(|(e, _, _)| *e == epoch) {
            return;
        }
        let segments = self.segments(epoch);
        let (docs, cfg) = (self.docs.clone(), self.cfg.clone());
        let made = std::thread::Builder::new()
            .name("stoker-plan".into())
            .spawn(move || Ok(Arc::new(EpochPlan::new(&*docs, &cfg, epoch, None)?)));
        // Without a thread, the epoch is planned when it starts, as it would be anyway.
        *ahead = made.ok().map(|h| (epoch, segments.into_boxed_slice(), h));
    }

    /// The mixture weights over `epoch`: a loaded state's, for its epoch; else the weights in
    /// force last, from batch 0.
    fn segments(&self, epoch: u64) -> Vec<(u64, Vec<f64>)> {
        let p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        weights_for(&p, epoch)
    }

    /// Change a mixture's weights from the next global batch on (a data schedule; see
    /// [`TokenMix`] for what the rest of the epoch does). Call before starting or resuming
    /// the epoch; the change is kept in the state.
    /// Returns the state the next epoch() starts from, which holds the change.
    pub fn set_weights(&self, weights: &[f64]) -> Result<TokenState> {
        let Some(m) = &self.mix else {
            return Err(Error::invalid_option("set_weights is for a mix of token sources"));
        };
        if weights.len() != m.names().len() {
            return Err(Error::invalid_option(format!(
                "{} weights for a mix of {} sources",
                weights.len(),
                m.names().len()
            )));
        }
        super::mix::check_weights(weights)?;
        // Where the epoch in progress ends, asked only near the cap (it may plan the epoch; the
        // plan's lock is not the progress's: taken first).
        let near_cap = {
            let p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            let s = p.1.as_ref().unwrap_or(&p.0);
            (s.weights.len() >= super::mix::MAX_WEIGHT_CHANGES).then_some(s.epoch)
        };
        let epoch_end = near_cap.and_then(|epoch| self.batches(epoch).ok());
        let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        // Not resuming: the change applies from where the run stands (the next epoch() starts
        // there: its batch when the epoch is unfinished, else batch 0 of the next).
        let pending = p.1.take();
        let mut state = pending.clone().unwrap_or_else(|| p.0.clone());
        let at = state.batch;
        state.weights.retain(|(b, _)| *b < at);
        // Counted within the epoch the change falls in: one after its last batch starts the
        // next epoch, with the weights alone.
        if state.weights.len() >= super::mix::MAX_WEIGHT_CHANGES && epoch_end.is_none_or(|end| at < end) {
            p.1 = pending;
            return Err(Error::invalid_option(super::mix::too_many_changes(state.weights.len() + 1)));
        }
        state.weights.push((at, weights.to_vec()));
        p.1 = Some(state.clone());
        Ok(state)
    }

    /// Tokens this rank read per mixture source, by name (empty for one source).
    pub fn source_tokens(&self) -> Vec<(String, u64)> {
        let names = self.mix.as_ref().map(|m| m.names()).unwrap_or_default();
        names.into_iter().zip(self.source_tokens.iter().map(|c| c.load(Relaxed))).collect()
    }

    /// Global batches in `epoch` (each rank gets its rows of every one).
    pub fn batches(&self, epoch: u64) -> Result<u64> {
        let plan = self.plan(epoch)?;
        let g = self.cfg.global_batch as u64;
        Ok(if self.cfg.pad_tail { plan.sequences.div_ceil(g) } else { plan.sequences / g })
    }

    /// Tokens in `epoch`'s stream (documents with their BOS and EOS).
    pub fn tokens(&self, epoch: u64) -> Result<u64> {
        Ok(self.plan(epoch)?.total_tokens())
    }

    /// Where the run stands (the next global batch to deliver).
    ///
    /// After an epoch's last global batch, it is the next epoch's start.
    pub fn state(&self) -> TokenState {
        let s = self.progress.lock().unwrap_or_else(|e| e.into_inner()).0.clone();
        self.past_its_epoch(s)
    }

    /// Take over `parent`'s books (where its run stands, a state loaded or changed by
    /// [`set_weights`](Self::set_weights) and not yet used, the weights in force), read
    /// without waiting: `false`, taking nothing, while another thread holds them. For a forked
    /// child's loader, made like its parent's: it then goes on as the parent would (a state
    /// the parent has used is not resumed again, the mix's weights are the ones in force). The
    /// parent's lock may have been held at the fork by a thread the child does not have.
    pub fn adopt_books_of(&self, parent: &TokenLoader) -> bool {
        let Some(books) = crate::fork::lock_if_free(&parent.progress).map(|p| p.clone()) else { return false };
        *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = books;
        true
    }

    /// `s`, or the next epoch's start (with the weights last in force) when `s` is at its
    /// epoch's end: resumed as it is, the epoch would give no batch, and a loop that then asks
    /// for the next epoch would have skipped one.
    fn past_its_epoch(&self, s: TokenState) -> TokenState {
        match self.batches(s.epoch) {
            Ok(end) if s.batch > 0 && s.batch >= end => {
                let weights = s.weights.last().map(|(_, w)| vec![(0, w.clone())]).unwrap_or_default();
                TokenState { epoch: s.epoch.saturating_add(1), batch: 0, weights, ..s }
            }
            _ => s,
        }
    }

    /// Continue from `state`: the next [`epoch`](Self::epoch) call for the epoch it resumes in
    /// (what [`state`](Self::state) then says: a state at its epoch's end resumes at the next
    /// epoch's start) starts at its batch. The world size may differ from the one that saved it.
    pub fn load_state(&self, state: TokenState) -> Result<()> {
        let documents = self.docs.documents();
        if state.documents != documents
            || state.seq_len != self.cfg.seq_len
            || state.global_batch != self.cfg.global_batch
        {
            return Err(Error::invalid_option(format!(
                "the saved state is for {} documents in global batches of {} x {} tokens; this loader has {documents} \
                 documents and {} x {}: resume with the same data, seq_len and global_batch",
                state.documents, state.global_batch, state.seq_len, self.cfg.global_batch, self.cfg.seq_len
            )));
        }
        let names = self.mix.as_ref().map(|m| m.names());
        if let (Some(theirs), Some(mine)) = (&state.sources, &names) {
            if theirs != mine {
                return Err(crate::loader::other_mix_sources(theirs, mine));
            }
        }
        let sources = names.as_ref().map_or(0, Vec::len);
        let bad = |why: String| Err(Error::invalid_option(format!("the saved state's mix weights: {why}")));
        match (sources, state.weights.first()) {
            (0, None) if state.sources.is_none() => {} // sources named, or weights: a mix's state
            (0, _) => return bad("this loader reads no mix".into()),
            (_, None) => return bad(format!("none, for a mix of {sources} sources")),
            (_, Some((first, _))) if *first != 0 => return bad("the first does not start at batch 0".into()),
            _ => {}
        }
        if state.weights.len() > super::mix::MAX_WEIGHT_CHANGES {
            return bad(super::mix::too_many_changes(state.weights.len()));
        }
        for (i, (b, w)) in state.weights.iter().enumerate() {
            if w.len() != sources {
                return bad(format!("{} weights for a mix of {sources} sources", w.len()));
            }
            super::mix::check_weights(w)?;
            if i > 0 && *b < state.weights[i - 1].0 {
                return bad("changes out of order".into());
            }
        }
        let mine = TokenStream::of(&self.cfg);
        if let Some(theirs) = state.stream.as_ref().filter(|s| **s != mine) {
            return Err(Error::invalid_option(format!(
                "the saved state is for a token stream {theirs}; this loader's is {mine}: resume with the same order, \
                 seed, BOS/EOS, packing and labels"
            )));
        }
        if let Some(tokens) = state.tokens.filter(|&t| t != self.data_tokens()) {
            return Err(Error::invalid_option(format!(
                "the saved state is for documents of {tokens} tokens in all; this loader's hold {}: the data changed \
                 (tokenized again, or other files of as many documents); resume with the data it was saved with",
                self.data_tokens()
            )));
        }
        // A state of an earlier version, taken as it is, carries this loader's stream from here
        // on: the run's next states are checked at their resume.
        let mut state = state;
        state.stream.get_or_insert(mine);
        if state.sources.is_none() {
            state.sources = names;
        }
        let before = std::mem::replace(
            &mut *self.progress.lock().unwrap_or_else(|e| e.into_inner()),
            (state.clone(), Some(state.clone())),
        );
        // The epoch's length under the state's own weights, known once they are in place. A
        // run's state stands at most at its epoch's end; one past it would be taken as the end
        // and skip the rest of the epoch.
        let refused = match self.batches(state.epoch) {
            Ok(end) if state.batch > end => Some(Error::invalid_option(format!(
                "the saved state is at global batch {} of epoch {}, which has {end}: it is not a state this loader \
                 wrote",
                state.batch, state.epoch
            ))),
            Ok(_) => None,
            Err(e) => Some(e),
        };
        if let Some(e) = refused {
            *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = before;
            return Err(e);
        }
        // One at its epoch's end (as earlier versions kept it) is the next epoch's start: asked
        // once it is in place, so that its own weights plan its epoch.
        let next = self.state();
        if next.epoch != state.epoch {
            *self.progress.lock().unwrap_or_else(|e| e.into_inner()) = (next.clone(), Some(next));
        }
        Ok(())
    }

    /// Counters since the loader was made.
    pub fn stats(&self) -> StatsSnapshot {
        let damage = self.source.as_ref().map(|s| s.damage()).unwrap_or_default();
        self.stats.snapshot_with_damage(self.docs.io_counters(), damage)
    }

    /// This rank's batches of `epoch`, from a loaded state's batch when it is for this epoch.
    pub fn epoch(&self, epoch: u64) -> Result<TokenEpoch> {
        let plan = self.plan(epoch)?;
        let data_tokens = self.data_tokens();
        if let Some(next) = epoch.checked_add(1) {
            self.plan_ahead(next);
        }
        let end = self.batches(epoch)?;
        if end == 0 {
            let (tokens, rows, window) = (self.tokens(epoch)?, self.cfg.global_batch, self.cfg.window());
            let reason = format!(
                "epoch {epoch}'s stream holds {tokens} tokens, not one global batch of {rows} rows of {window}: \
                 nothing to train on (pad_tail=True delivers what there is, padded; or a smaller batch)"
            );
            return Err(Error::Empty { uri: self.docs.to_string(), reason });
        }
        let start = {
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            let weights = weights_for(&p, epoch);
            let start = match p.1.take() {
                Some(s) if s.epoch == epoch => s.batch.min(end),
                _ => 0,
            };
            p.0.epoch = epoch;
            p.0.batch = start;
            p.0.weights = weights;
            p.0.tokens = Some(data_tokens);
            start
        };
        let job = Arc::new(Job {
            docs: self.docs.clone(),
            mix: self.mix.clone(),
            source_tokens: self.source_tokens.clone(),
            cfg: self.cfg.clone(),
            cols: self.cols.clone(),
            pool: self.pool.clone(),
            plan,
            epoch,
        });
        let prefetch = self.cfg.prefetch.max(1);
        let from = if self.docs.reads_in_place() {
            // Local documents are read in place, so a batch is a few dozen copies out of a map and some
            // arithmetic: handing every batch between the runtime and a blocking thread cost
            // more than building it. Instead `producers` threads build groups of batches in
            // a loop ([`produce`]). Plain threads, not the runtime's blocking pool: a runtime
            // the loader owns waits for its blocking work when dropped, and a producer waits
            // for room while the epoch lives, so dropping the loader before the epoch would hang.
            produce::spawn(&job, (start, end), self.shape)?
        } else {
            let (tx, rx) = mpsc::channel(prefetch);
            let task = self.runtime.spawn(async move {
                // Each batch its own task, so the runtime's threads build `prefetch` of them at
                // once (in one task they would take turns on one thread); delivered in order,
                // each a group of its own.
                let mut batches = futures::stream::iter(start..end)
                    .map(|b| {
                        let job = job.clone();
                        let built = tokio::spawn(async move { job.batch(b).await });
                        async move { built.await.map_err(Error::task)? }
                    })
                    .buffered(prefetch);
                let mut g = 0u64;
                while let Some(item) = batches.next().await {
                    let failed = item.is_err();
                    if tx.send((g, vec![item])).await.is_err() || failed {
                        break;
                    }
                    g += 1;
                }
            });
            Producers { rx, groups: end - start, claims: None, task: Some(task) }
        };
        Ok(TokenEpoch::new(from, self.stats.clone(), self.progress.clone(), epoch, end - start))
    }
}

/// The mixture weights over `epoch` (the one rule `plan` and `epoch` share): a pending state's
/// for its own epoch; for another epoch the weights last in force (a pending state's, else the
/// run's), from batch 0; the run's own schedule when it is in `epoch`.
fn weights_for(p: &(TokenState, Option<TokenState>), epoch: u64) -> Vec<(u64, Vec<f64>)> {
    let last = |s: &TokenState| s.weights.last().map(|(_, w)| vec![(0, w.clone())]).unwrap_or_default();
    match &p.1 {
        Some(s) if s.epoch == epoch => s.weights.clone(),
        Some(s) => last(s),
        None if p.0.epoch == epoch => p.0.weights.clone(),
        None => last(&p.0),
    }
}
