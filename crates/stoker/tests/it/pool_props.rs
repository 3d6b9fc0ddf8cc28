//! Property test: random interleavings of acquire / fence / complete / drop
//! from several threads never hand a buffer out twice, and never hand out a
//! buffer whose fences have not all completed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use stoker::pinned::{CopyEvent, FakeEvent, HostBuffer, HostPool, PoolConfig};

#[derive(Debug, Clone)]
enum Op {
    Acquire,
    Fence(usize),
    Complete(usize),
    Drop(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Acquire),
        2 => any::<usize>().prop_map(Op::Fence),
        1 => any::<usize>().prop_map(Op::Complete),
        3 => any::<usize>().prop_map(Op::Drop),
    ]
}

/// What the test believes about each buffer id.
#[derive(Default)]
struct Entry {
    held: bool,
    /// Fences set during the current (or last) loan.
    fences: Vec<Arc<FakeEvent>>,
}

struct World {
    pool: HostPool,
    ledger: Mutex<Vec<Entry>>,
    events: Mutex<Vec<Arc<FakeEvent>>>,
    acquired: AtomicU64,
}

impl World {
    fn took(&self, b: &HostBuffer) {
        let mut ledger = self.ledger.lock().unwrap();
        let e = &mut ledger[b.id()];
        assert!(!e.held, "buffer {} handed out twice", b.id());
        assert!(e.fences.iter().all(|f| f.is_complete()), "buffer {} reused before its copy completed", b.id());
        e.held = true;
        e.fences.clear();
        self.acquired.fetch_add(1, Ordering::SeqCst);
    }

    fn give_back(&self, b: HostBuffer) {
        // Mark it free before the pool sees it, or another thread could get it
        // while the ledger still says "held".
        self.ledger.lock().unwrap()[b.id()].held = false;
        drop(b);
    }

    fn run(&self, script: Vec<Op>) {
        let mut holding: Vec<HostBuffer> = Vec::new();
        for op in script {
            match op {
                Op::Acquire => {
                    // Blocking only with empty hands: then whoever holds buffers
                    // never blocks, and the simulated GPU completes every event,
                    // so the test cannot deadlock.
                    let got =
                        if holding.is_empty() { Some(self.pool.acquire().unwrap()) } else { self.pool.try_acquire() };
                    if let Some(b) = got {
                        self.took(&b);
                        holding.push(b);
                    }
                }
                Op::Fence(i) if !holding.is_empty() => {
                    let n = holding.len();
                    let b = &mut holding[i % n];
                    let ev = Arc::new(FakeEvent::new());
                    self.ledger.lock().unwrap()[b.id()].fences.push(ev.clone());
                    b.fence(ev.clone());
                    self.events.lock().unwrap().push(ev);
                }
                Op::Complete(k) => {
                    let events = self.events.lock().unwrap();
                    if !events.is_empty() {
                        events[k % events.len()].complete();
                    }
                }
                Op::Drop(i) if !holding.is_empty() => {
                    let n = holding.len();
                    self.give_back(holding.swap_remove(i % n));
                }
                Op::Fence(_) | Op::Drop(_) => {}
            }
        }
        holding.into_iter().for_each(|b| self.give_back(b));
    }
}

fn check(buffers: usize, scripts: Vec<Vec<Op>>) {
    let world = Arc::new(World {
        pool: HostPool::new(PoolConfig { buffer_bytes: 16, buffers, device: None }).unwrap(),
        ledger: Mutex::new((0..buffers).map(|_| Entry::default()).collect()),
        events: Mutex::default(),
        acquired: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    // A slow "GPU" that finishes copies in submission order, so fenced buffers
    // really are pending while the workers run.
    let gpu = {
        let (world, stop) = (world.clone(), stop.clone());
        thread::spawn(move || {
            let mut next = 0;
            while !stop.load(Ordering::SeqCst) {
                if let Some(ev) = world.events.lock().unwrap().get(next) {
                    ev.complete();
                    next += 1;
                }
                thread::sleep(Duration::from_micros(100));
            }
        })
    };
    let workers: Vec<_> = scripts
        .into_iter()
        .map(|script| {
            let world = world.clone();
            thread::spawn(move || world.run(script))
        })
        .collect();
    let outcome: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
    stop.store(true, Ordering::SeqCst);
    gpu.join().unwrap();
    for r in outcome {
        if let Err(panic) = r {
            std::panic::resume_unwind(panic);
        }
    }

    let s = world.pool.stats();
    assert_eq!(s.acquires, world.acquired.load(Ordering::SeqCst));
    assert_eq!((s.in_use, s.free + s.pending, s.lost), (0, buffers, 0));
    world.events.lock().unwrap().iter().for_each(|e| e.complete());
    let all: Vec<HostBuffer> = (0..buffers).map(|_| world.pool.try_acquire().expect("all reclaimable")).collect();
    let mut ids: Vec<usize> = all.iter().map(HostBuffer::id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..buffers).collect::<Vec<_>>());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_buffer_is_handed_out_twice_or_early(
        buffers in 1usize..4,
        scripts in vec(vec(op(), 0..60), 2..=3),
    ) {
        check(buffers, scripts);
    }
}
