//! Keeps one thread's backward pass from freeing a graph that another thread is building.
//!
//! Burn 0.21's autodiff ends every backward pass by freeing, in *every* graph of the process,
//! the roots that no live tensor refers to at that instant (`GraphCleaner` in burn-autodiff's
//! `runtime/graph.rs`). A graph under construction has such instants: an operation takes its
//! inputs by value and drops them before it registers its output, and a small graph (a router's
//! query and key-norm weight, before they meet the hidden state) may then hold no live tensor at
//! all. A cleanup that lands there frees the graph's roots, and the parameters behind them get no
//! gradient from the backward pass to come. Burn fixed this after 0.21 (tracel-ai/burn#5573,
//! #5647); until the workspace can move to a fixed release, threads that train at once pass
//! through this gate (docs/model.md, "Gradients on several threads at once").
//!
//! The gate admits any number of threads building graphs, or any number running backward
//! passes, never both: a graph being built never meets a cleanup. Backward passes may overlap
//! one another (a cleanup waits for the lock of a graph that is running its own backward pass),
//! and so may forward passes. A finished graph is safe once its loss exists: the loss is a live
//! tensor until its backward pass.
//!
//! Holding a [`GatePass`] across anything that waits for another thread's pass of the other
//! kind (an all-reduce between replicas, for one) would deadlock; hold it only around the graph's
//! construction and around `backward()`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// What a thread does with autodiff graphs while it holds a [`GatePass`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphWork {
    /// Builds a graph: a forward pass and its loss, up to the loss tensor.
    Building,
    /// Runs `backward()`, which ends with the process-wide cleanup.
    Backward,
}

impl GraphWork {
    /// Both kinds.
    pub const ALL: [GraphWork; 2] = [GraphWork::Building, GraphWork::Backward];

    fn index(self) -> usize {
        self as usize
    }
    fn other(self) -> Self {
        match self {
            Self::Building => Self::Backward,
            Self::Backward => Self::Building,
        }
    }
}

#[derive(Debug)]
struct GateState {
    /// The kind of work inside, or of the last work that was.
    current: GraphWork,
    /// Threads inside.
    inside: usize,
    /// Threads waiting, by kind.
    waiting: [usize; 2],
}

static STATE: Mutex<GateState> = Mutex::new(GateState {
    current: GraphWork::Building,
    inside: 0,
    waiting: [0, 0],
});
static TURN: Condvar = Condvar::new();
static ENTERED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// How many passes for `work` the gate has given since the process started: a caller's tests
/// can check that its graph work goes through the gate.
pub fn passes_given(work: GraphWork) -> u64 {
    ENTERED[work.index()].load(Ordering::Relaxed)
}

/// Permission to do one kind of [`GraphWork`]; the gate reopens for the other kind when the last
/// pass of this kind is dropped.
#[must_use = "the pass admits the work only while it is held"]
#[derive(Debug)]
pub struct GatePass {
    work: GraphWork,
}

/// Waits until `work` may start, and returns the pass that admits it. Work of the same kind
/// joins the threads inside unless the other kind is waiting; then the other kind goes next,
/// so that neither starves.
pub fn enter(work: GraphWork) -> GatePass {
    let mut state = lock();
    state.waiting[work.index()] += 1;
    loop {
        let other_waits = state.waiting[work.other().index()] > 0;
        let admitted = match state.inside {
            0 => !(other_waits && state.current == work),
            _ => state.current == work && !other_waits,
        };
        if admitted {
            break;
        }
        state = TURN
            .wait(state)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    state.waiting[work.index()] -= 1;
    state.current = work;
    state.inside += 1;
    ENTERED[work.index()].fetch_add(1, Ordering::Relaxed);
    GatePass { work }
}

impl GatePass {
    /// The kind of work this pass admits.
    pub fn work(&self) -> GraphWork {
        self.work
    }
}

impl Drop for GatePass {
    fn drop(&mut self) {
        let mut state = lock();
        state.inside -= 1;
        if state.inside == 0 {
            TURN.notify_all();
        }
    }
}

/// The gate's state; a panic while it was held poisons nothing it guards (counters only).
fn lock() -> MutexGuard<'static, GateState> {
    STATE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
