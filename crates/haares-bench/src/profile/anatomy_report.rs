//! The markdown of `haares-bench anatomy` ([`crate::profile::anatomy`]): per method, every
//! operation's forward and backward milliseconds per steady step, what the phases spent outside
//! them, and beside PyTorch's profiler the same step by category; then the matrix products by
//! shape, ours beside PyTorch's.

use std::fmt::Write as _;

use haares_core::op_times::{OpTime, Pass, ProductShape};

use crate::peer::profile::PeerProfile;
use crate::profile::anatomy::{AnatomyRun, MethodAnatomy, pass_total};

/// How many of PyTorch's operations the report lists.
const PEER_ROWS: usize = 12;

/// A category of work both implementations have: our operations in it, and a test on the
/// names of PyTorch's.
struct Category {
    name: &'static str,
    ours: &'static [&'static str],
    theirs: fn(&str) -> bool,
}

/// PyTorch's fused attention (SDPA) computes its own products, which ours may leave to the
/// matrix products (Flex does): one category holds both.
const CATEGORIES: [Category; 2] = [
    Category {
        name: "matrix products and attention",
        ours: &["matmul", "projections", "attention", "softmax"],
        theirs: |name| {
            matches!(
                name,
                "aten::mm" | "aten::addmm" | "aten::bmm" | "aten::baddbmm" | "aten::matmul"
            ) || name.contains("scaled_dot_product")
                || name.contains("flash_attention")
        },
    },
    Category {
        name: "cross-entropy",
        ours: &["cross_entropy"],
        theirs: |name| {
            name.contains("log_softmax")
                || name.contains("nll_loss")
                || name.contains("cross_entropy")
        },
    },
];

/// The whole report.
pub fn report(run: &AnatomyRun) -> String {
    let spec = &run.spec;
    let mut out = format!(
        "# Step anatomy on `{}`\n\nThe cost protocol's `cpu` sizes: small family (d = 128), {} \
         layers, N = {}, batch {} × {}; {} steps per method in a fresh worker, the last {} timed. \
         Milliseconds per steady step. An operation's time is its call's wall time (forward) and \
         its graph node's backward pass; \"other\" is what the phase spent outside them (residual \
         adds, reshapes, the embedding, Burn's graph bookkeeping, allocation).\n",
        spec.backend,
        spec.layers,
        spec.blocks,
        spec.batch,
        spec.seq,
        spec.steps,
        spec.steps - spec.warmup,
    );
    if let Some(why) = &run.peer_skipped {
        let _ = writeln!(out, "\nPyTorch peer: not (fully) measured: {why}");
    }
    for method in &run.methods {
        write_method(&mut out, method, run.torch_version.as_deref());
    }
    out
}

fn ms(seconds: f64) -> String {
    format!("{:.2}", seconds * 1e3)
}

fn write_method(out: &mut String, method: &MethodAnatomy, torch: Option<&str>) {
    let [forward, backward, update] = method.phase_s;
    let _ = write!(
        out,
        "\n## {}\n\nSteady step {} ms (median); mean phases: forward {} (with the loss), \
         backward {}, update {}.\n\n\
         | operation | forward | backward | calls (fwd / bwd) | share of the step |\n\
         |---|---|---|---|---|\n",
        method.method.label(),
        ms(method.step_s),
        ms(forward),
        ms(backward),
        ms(update),
    );
    let step: f64 = method.phase_s.iter().sum();
    let mut names: Vec<&str> = Vec::new();
    for op in &method.operations {
        if !names.contains(&op.operation.as_str()) {
            names.push(&op.operation);
        }
    }
    names.sort_by(|a, b| total(method, b).total_cmp(&total(method, a)));
    for name in names {
        let (fwd, bwd) = (
            find(method, name, Pass::Forward),
            find(method, name, Pass::Backward),
        );
        let calls = |op: Option<&OpTime>| op.map_or("–".into(), |op| op.calls.to_string());
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} / {} | {:.1}% |",
            fwd.map_or("–".into(), |op| ms(op.seconds)),
            bwd.map_or("–".into(), |op| ms(op.seconds)),
            calls(fwd),
            calls(bwd),
            100.0 * total(method, name) / step,
        );
    }
    let other_forward = forward - pass_total(&method.operations, Pass::Forward);
    let other_backward = backward - pass_total(&method.operations, Pass::Backward);
    let _ = writeln!(
        out,
        "| other | {} | {} | | {:.1}% |\n| update (AdamW, gradient norm, clip) | {} | | | {:.1}% |",
        ms(other_forward),
        ms(other_backward),
        100.0 * (other_forward + other_backward) / step,
        ms(update),
        100.0 * update / step,
    );
    if let Some(peer) = &method.peer {
        write_peer(out, method, peer, torch.unwrap_or("?"));
    }
    write_products(out, method);
}

/// The matrix products by shape, slowest first (ours), with PyTorch's products of the same shape
/// where the peer ran; a shape only one side computes has "–" on the other.
fn write_products(out: &mut String, method: &MethodAnatomy) {
    if method.products.is_empty() {
        return;
    }
    let peer_products = method.peer.as_ref().map(|peer| &peer.products[..]);
    let mut shapes: Vec<ProductShape> = method.products.iter().map(|p| p.shape).collect();
    for product in peer_products.unwrap_or_default() {
        if !shapes.contains(&product.shape()) {
            shapes.push(product.shape());
        }
    }
    let ours = |shape: &ProductShape| method.products.iter().find(|p| p.shape == *shape);
    // PyTorch may list one shape more than once (`mm` and `addmm`, or both orientations).
    let theirs = |shape: &ProductShape| {
        let matching = (peer_products.unwrap_or_default().iter()).filter(|p| p.shape() == *shape);
        let (seconds, calls) = matching.fold((0.0, 0.0), |(s, c), p| (s + p.seconds, c + p.calls));
        (calls > 0.0).then_some((seconds, calls))
    };
    let ours_s = |shape: &ProductShape| ours(shape).map_or(0.0, |p| p.seconds);
    shapes.sort_by(|a, b| ours_s(b).total_cmp(&ours_s(a)));
    let _ = write!(
        out,
        "\nMatrix products by shape, both passes (a product and its transpose, `C = A B` and `Cᵀ = \
         Bᵀ Aᵀ`, are one shape: the output's sides and the depth), each call timed on its own: ours in \
         the step above, PyTorch's (`aten::mm`, `addmm`, `bmm`) in steps run after the profiled \
         ones, outside the profiler:\n\n\
         | output sides, depth | calls | ours (ms) | ours GFLOP/s |{}\n|---|---|---|---|{}\n",
        match peer_products {
            Some(_) => " PyTorch calls | PyTorch (ms) | PyTorch GFLOP/s | ours / PyTorch |",
            None => "",
        },
        if peer_products.is_some() {
            "---|---|---|---|"
        } else {
            ""
        },
    );
    let rate = |shape: &ProductShape, seconds: f64, calls: f64| {
        format!("{:.1}", shape.flops() * calls / seconds / 1e9)
    };
    for shape in &shapes {
        let mut line = format!("| {} |", describe(shape));
        let _ = match ours(shape) {
            Some(p) => write!(
                line,
                " {} | {} | {} |",
                p.calls,
                ms(p.seconds),
                rate(shape, p.seconds, p.calls as f64)
            ),
            None => write!(line, " – | – | – |"),
        };
        if peer_products.is_some() {
            let _ = match (theirs(shape), ours(shape)) {
                (Some((seconds, calls)), ours) => write!(
                    line,
                    " {calls:.0} | {} | {} | {} |",
                    ms(seconds),
                    rate(shape, seconds, calls),
                    ours.map_or("–".into(), |p| format!("{:.2}×", p.seconds / seconds)),
                ),
                (None, _) => write!(line, " – | – | – | – |"),
            };
        }
        let _ = writeln!(out, "{line}");
    }
}

/// `1024 × 128, depth 1024`, with `32 × ` before a batch of 32 products.
fn describe(shape: &ProductShape) -> String {
    let [short, long] = shape.sides;
    match shape.matrices {
        1 => format!("{short} × {long}, depth {}", shape.depth),
        matrices => format!("{matrices} × ({short} × {long}, depth {})", shape.depth),
    }
}

fn find<'a>(method: &'a MethodAnatomy, name: &str, pass: Pass) -> Option<&'a OpTime> {
    (method.operations.iter()).find(|op| op.operation == name && op.pass == pass)
}

fn total(method: &MethodAnatomy, name: &str) -> f64 {
    (method.operations.iter())
        .filter(|op| op.operation == name)
        .map(|op| op.seconds)
        .sum()
}

fn write_peer(out: &mut String, method: &MethodAnatomy, peer: &PeerProfile, torch: &str) {
    let [forward, backward, update] = peer.phase_s;
    let _ = write!(
        out,
        "\nPyTorch {torch} eager, the same model and batch: forward {} ms, backward {}, update {} \
         (medians, without the profiler). By category, ours against PyTorch's self time under \
         `torch.profiler` (its overhead included); \"everything else\" is each side's forward \
         and backward less the categories above it:\n\n\
         | category | ours | PyTorch | ours / PyTorch |\n|---|---|---|---|\n",
        ms(forward),
        ms(backward),
        ms(update),
    );
    let (mut ours_left, mut theirs_left) =
        (method.phase_s[0] + method.phase_s[1], forward + backward);
    let mut row = |name: &str, ours: f64, theirs: f64| {
        let _ = match ours > 0.0 {
            true => writeln!(
                out,
                "| {name} | {} | {} | {:.2}× |",
                ms(ours),
                ms(theirs),
                ours / theirs
            ),
            // Not an operation of its own on this backend: its plain operations are "everything
            // else".
            false => writeln!(out, "| {name} | – | {} | – |", ms(theirs)),
        };
    };
    for category in &CATEGORIES {
        let ours: f64 = category.ours.iter().map(|name| total(method, name)).sum();
        let theirs: f64 = (peer.operations.iter())
            .filter(|op| (category.theirs)(&op.name))
            .map(|op| op.self_s)
            .sum();
        ours_left -= ours;
        theirs_left -= theirs;
        row(category.name, ours, theirs);
    }
    row(
        "everything else in forward and backward",
        ours_left,
        theirs_left,
    );
    row("update", method.phase_s[2], update);
    row(
        "whole step",
        method.phase_s.iter().sum(),
        peer.phase_s.iter().sum(),
    );
    let _ = write!(
        out,
        "\nPyTorch's slowest operations (self time):\n\n| operation | ms per step | calls per step |\n|---|---|---|\n"
    );
    for op in peer.operations.iter().take(PEER_ROWS) {
        let _ = writeln!(
            out,
            "| `{}` | {} | {:.0} |",
            op.name,
            ms(op.self_s),
            op.calls
        );
    }
}
