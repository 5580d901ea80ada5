//! `bench-driver [--quick] [--scale 1k,10k,100k]`: runs the side-by-side suite (see the crate
//! doc) and writes its report. `cargo xtask bench` builds everything in release and runs this.
//!
//! For every workload and scale, one server serves the same bytes to every client; the clients
//! run in child processes (so each peak RSS is its own), kinformer and kube-runtime alternating
//! and swapping who goes first each round; the floor is measured in the same rounds. P1 runs
//! both clients twice per round, once linked with glibc's malloc (`bench-client`) and once with
//! mimalloc (`bench-client-mimalloc`). Every wall time has the client process's CPU seconds
//! (user + system, all threads) beside it. Reported: medians, ranges (min–max), kinformer /
//! kube-runtime and kinformer / floor, and a goals table: each goal of the performance issue
//! (W1–W6, P3, P5, P6) next to the figure of this run that decides it.
//!
//! A full run writes the report between the markers in `BENCHMARKS.md` and the plots into
//! `bench/plots/`. It refuses to start on a tree with uncommitted changes (the report names the
//! commit it measured) unless `--allow-dirty` is given, and then says so in the report; if HEAD
//! moves during the run, the report goes to `target/bench/` instead. `--quick` (smaller scales,
//! 2 rounds, a 5-second P5) writes both under `target/bench/` so a CI smoke run leaves the tree
//! alone; a run of some workloads only (`--only p6`) writes its report to
//! `target/bench/BENCHMARKS.partial.md`.
//!
//! P6 (the priority queue against the FIFO queue) is kinformer only: kube-runtime has no
//! priority queue; its client is `bench/examples/bench-priority.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use kinformer_bench::Outcome;
use plotters::prelude::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const BEGIN: &str = "<!-- cargo xtask bench: begin (generated; edit bench/src/bin/bench-driver.rs instead) -->";
const END: &str = "<!-- cargo xtask bench: end -->";

/// Every workload, in the report's order: P1 to P6, W4's readers, W5/W6's kinds.
const WORKLOADS: [&str; 8] = ["p1", "p2", "readers", "kinds", "p3", "p4", "p5", "p6"];

/// The side-by-side suite's driver (see the module doc).
#[derive(Parser, Debug)]
struct Args {
    /// Small scales, 2 rounds, a short P5: a smoke run (CI), a few minutes.
    #[arg(long)]
    quick: bool,
    /// Run a full report on a tree with uncommitted changes (the report says so).
    #[arg(long)]
    allow_dirty: bool,
    /// Object counts for P1 and P2, e.g. `1k,10k,100k` (P2's largest is capped at 50k).
    #[arg(long, value_delimiter = ',')]
    scale: Vec<String>,
    /// Rounds per workload and scale (default: 5, quick: 2).
    #[arg(long)]
    rounds: Option<usize>,
    /// Workloads to run (default: all).
    #[arg(long, value_delimiter = ',', default_values_t = WORKLOADS.map(String::from))]
    only: Vec<String>,
    /// The command line to print in the report.
    #[arg(long, default_value = "cargo xtask bench")]
    command: String,
}

fn parse_scale(s: &str) -> Result<usize, BoxError> {
    let s = s.trim().to_ascii_lowercase();
    let (digits, factor) = match s.strip_suffix('k') {
        Some(d) => (d, 1_000),
        None => match s.strip_suffix('m') {
            Some(d) => (d, 1_000_000),
            None => (s.as_str(), 1),
        },
    };
    Ok(digits.parse::<usize>()? * factor)
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The directory of this executable (`target/release`), where the other binaries are.
fn bin_dir() -> Result<PathBuf, BoxError> {
    let exe = std::env::current_exe()?;
    Ok(exe.parent().ok_or("executable has no directory")?.to_path_buf())
}

/// A server child that stops when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(mut command: Command) -> Result<Self, BoxError> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("server has no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let url = line.trim().to_string();
        if !url.starts_with("http") {
            let _ = child.kill();
            return Err(format!("server printed {url:?} instead of its URL").into());
        }
        Ok(Server { child, url })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs one client process (glibc's malloc) to its end (or kills it after `limit`) and parses
/// its outcome.
fn run_client(args: &[String], limit: Duration) -> Result<Outcome, BoxError> {
    run_example("bench-client", args, limit)
}

/// The global allocator a client binary is linked with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alloc {
    Glibc,
    Mimalloc,
}

impl Alloc {
    /// The client binary linked with this allocator.
    fn example(self) -> &'static str {
        match self {
            Alloc::Glibc => "bench-client",
            Alloc::Mimalloc => "bench-client-mimalloc",
        }
    }

    /// The key of `client` run with this allocator in a [`Cell`]: the client's name for glibc
    /// (the default everywhere), `client+mimalloc` otherwise.
    fn key(self, client: &str) -> String {
        match self {
            Alloc::Glibc => client.to_string(),
            Alloc::Mimalloc => format!("{client}+mimalloc"),
        }
    }
}

/// Runs the example `example` as [`run_client`] runs `bench-client`.
fn run_example(example: &str, args: &[String], limit: Duration) -> Result<Outcome, BoxError> {
    Ok(serde_json::from_str(&run_example_line(example, args, limit)?)?)
}

/// Runs the example `example` to its end (or kills it after `limit`) and returns the last line
/// it printed.
fn run_example_line(example: &str, args: &[String], limit: Duration) -> Result<String, BoxError> {
    let client = bin_dir()?.join("examples").join(example);
    let mut child = Command::new(&client)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{}: {e}", client.display()))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{example} {} ran longer than {limit:?}", args.join(" ")).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut out)?;
    }
    if !status.success() {
        return Err(format!("{example} {} failed ({status})", args.join(" ")).into());
    }
    let line = out.lines().last().ok_or_else(|| format!("{example} printed nothing"))?;
    Ok(line.to_string())
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Median, min and max of some samples.
#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    median: f64,
    min: f64,
    max: f64,
}

fn summary(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    Some(Summary {
        median,
        min: sorted[0],
        max: sorted[n - 1],
    })
}

/// Outcomes of one workload at one scale, by client.
#[derive(Default)]
struct Cell {
    by_client: BTreeMap<String, Vec<Outcome>>,
}

impl Cell {
    fn figure(&self, client: &str, pick: impl Fn(&Outcome) -> Option<f64>) -> Option<Summary> {
        let samples: Vec<f64> = self.by_client.get(client)?.iter().filter_map(pick).collect();
        summary(&samples)
    }
}

/// Formats a figure as `median (min–max)` with a unit function.
fn fmt_range(s: Option<Summary>, unit: impl Fn(f64) -> String) -> String {
    match s {
        Some(s) if s.min != s.max => format!("{} ({}–{})", unit(s.median), unit(s.min), unit(s.max)),
        Some(s) => unit(s.median),
        None => "—".into(),
    }
}

fn ratio(a: Option<Summary>, b: Option<Summary>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => format!("{:.2}×", a.median / b.median),
        _ => "—".into(),
    }
}

fn secs(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} ms", v * 1e3)
    } else {
        format!("{v:.2} s")
    }
}

fn micros(v: f64) -> String {
    format!("{:.1} µs", v * 1e6)
}

fn kb(v: f64) -> String {
    format!("{:.1} KB", v / 1024.0)
}

fn mb(v: f64) -> String {
    format!("{:.0} MB", v / (1024.0 * 1024.0))
}

fn per_sec(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M/s", v / 1e6)
    } else {
        format!("{:.0}k/s", v / 1e3)
    }
}

fn count(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// P6's two queues, as keys of its [`Cell`].
const PRIORITY: &str = "priority";
const FIFO: &str = "fifo";

const A: &str = "kinformer";
const B: &str = "kube-runtime";
const FLOOR: &str = "floor";

/// P1/P2: list → synced, update rate and memory for one kind over the scales, each client run
/// with every allocator of `allocs` in every round.
fn fill_workload(
    kind: &str,
    scales: &[usize],
    rounds: usize,
    updates: bool,
    strip: bool,
    allocs: &[Alloc],
) -> Result<BTreeMap<usize, Cell>, BoxError> {
    let mut cells = BTreeMap::new();
    for &n in scales {
        let updates_n = if updates { n } else { 0 };
        let mut server = Command::new(bin_dir()?.join("bench-server"));
        server.args(strings(&[
            "--kind",
            kind,
            "--count",
            &n.to_string(),
            "--updates",
            &updates_n.to_string(),
        ]));
        let server = Server::start(server)?;
        let mut cell = Cell::default();
        let limit = Duration::from_secs(120 + n as u64 / 500);
        for round in 0..rounds {
            let mut order: Vec<(Alloc, &str)> = allocs.iter().flat_map(|a| [(*a, A), (*a, B)]).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for (alloc, client) in order {
                let mut args = strings(&["--client", client, "--workload", "fill", "--kind", kind]);
                args.extend(strings(&["--server", &server.url, "--count", &n.to_string()]));
                args.extend(strings(&["--updates", &updates_n.to_string()]));
                if strip {
                    args.push("--strip-managed-fields".into());
                }
                let outcome = run_example(alloc.example(), &args, limit)?;
                let key = alloc.key(client);
                let updates = match (outcome.updates_per_sec, outcome.cpu_per_update) {
                    (Some(rate), Some(cpu)) => format!(", updates {} (CPU {}/update)", per_sec(rate), micros(cpu)),
                    _ => String::new(),
                };
                eprintln!(
                    "  {kind} {} {key:>21}: list {} (CPU {}){updates}, heap/object {}, peak RSS {}",
                    count(n),
                    outcome.list_secs.map_or("—".into(), secs),
                    outcome.list_cpu_secs.map_or("—".into(), secs),
                    outcome.heap_per_object.map_or("—".into(), kb),
                    outcome.peak_rss.map_or("—".into(), |v| mb(v as f64)),
                );
                cell.by_client.entry(key).or_default().push(outcome);
            }
            let floor = run_client(
                &strings(&[
                    "--client",
                    FLOOR,
                    "--workload",
                    "fill",
                    "--kind",
                    kind,
                    "--count",
                    &n.to_string(),
                ]),
                limit,
            )?;
            cell.by_client.entry(FLOOR.to_string()).or_default().push(floor);
        }
        cells.insert(n, cell);
    }
    Ok(cells)
}

/// One markdown table row.
fn table_row(out: &mut String, cells: &[String]) {
    let _ = writeln!(out, "| {} |", cells.join(" | "));
}

fn fill_table(title: &str, cells: &BTreeMap<usize, Cell>, updates: bool) -> String {
    let mut out = format!("\n#### {title}\n\n");
    out.push_str("| objects | list → synced, kinformer | CPU | kube-runtime | CPU | kinformer / kube-runtime, wall | CPU | floor (1 thread) | kinformer / floor | kube-runtime / floor |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (n, cell) in cells {
        let wall = |o: &Outcome| o.list_secs;
        let cpu = |o: &Outcome| o.list_cpu_secs;
        let (a, b, f) = (cell.figure(A, wall), cell.figure(B, wall), cell.figure(FLOOR, wall));
        let (ac, bc) = (cell.figure(A, cpu), cell.figure(B, cpu));
        table_row(
            &mut out,
            &[
                count(*n),
                fmt_range(a, secs),
                fmt_range(ac, secs),
                fmt_range(b, secs),
                fmt_range(bc, secs),
                ratio(a, b),
                ratio(ac, bc),
                fmt_range(f, secs),
                ratio(a, f),
                ratio(b, f),
            ],
        );
    }
    if updates {
        out.push_str("\n| objects, then as many updates | updates applied, kinformer | CPU per update | kube-runtime | CPU per update | kinformer / kube-runtime, rate | CPU per update |\n|---|---|---|---|---|---|---|\n");
        for (n, cell) in cells {
            let rate = |o: &Outcome| o.updates_per_sec;
            let cpu = |o: &Outcome| o.cpu_per_update;
            let (a, b) = (cell.figure(A, rate), cell.figure(B, rate));
            let (ac, bc) = (cell.figure(A, cpu), cell.figure(B, cpu));
            table_row(
                &mut out,
                &[
                    count(*n),
                    fmt_range(a, per_sec),
                    fmt_range(ac, micros),
                    fmt_range(b, per_sec),
                    fmt_range(bc, micros),
                    ratio(a, b),
                    ratio(ac, bc),
                ],
            );
        }
    }
    out.push_str("\n| objects | heap per object, kinformer | kube-runtime | kinformer / kube-runtime | one decoded object (floor) | peak RSS, kinformer | kube-runtime | kinformer / kube-runtime |\n|---|---|---|---|---|---|---|---|\n");
    for (n, cell) in cells {
        let pick = |o: &Outcome| o.heap_per_object;
        let (a, b, f) = (cell.figure(A, pick), cell.figure(B, pick), cell.figure(FLOOR, pick));
        let rss = |o: &Outcome| o.peak_rss.map(|v| v as f64);
        let (ar, br) = (cell.figure(A, rss), cell.figure(B, rss));
        table_row(
            &mut out,
            &[
                count(*n),
                fmt_range(a, kb),
                fmt_range(b, kb),
                ratio(a, b),
                fmt_range(f, kb),
                fmt_range(ar, mb),
                fmt_range(br, mb),
                ratio(ar, br),
            ],
        );
    }
    out
}

/// P1 with each allocator: each client's medians with glibc's malloc → with mimalloc (and
/// mimalloc / glibc), and kinformer / kube-runtime under each allocator.
fn alloc_table(cells: &BTreeMap<usize, Cell>) -> String {
    type Pick = fn(&Outcome) -> Option<f64>;
    type Unit = fn(f64) -> String;
    let figures: [(Pick, Unit); 5] = [
        (|o| o.list_secs, secs),
        (|o| o.list_cpu_secs, secs),
        (|o| o.updates_per_sec, per_sec),
        (|o| o.cpu_per_update, micros),
        (|o| o.peak_rss.map(|v| v as f64), mb),
    ];
    let mut out = String::from(
        "\n#### P1 with each allocator: glibc malloc → mimalloc (mimalloc / glibc)\n\n\
         | objects | client | list → synced | list CPU | updates applied | CPU per update | peak RSS |\n|---|---|---|---|---|---|---|\n",
    );
    for (n, cell) in cells {
        for client in [A, B] {
            let mut row = vec![count(*n), client.to_string()];
            for (pick, unit) in figures {
                let glibc = cell.figure(&Alloc::Glibc.key(client), pick);
                let mimalloc = cell.figure(&Alloc::Mimalloc.key(client), pick);
                row.push(match (glibc, mimalloc) {
                    (Some(g), Some(m)) => {
                        format!("{} → {} ({})", unit(g.median), unit(m.median), ratio(mimalloc, glibc))
                    }
                    _ => "—".into(),
                });
            }
            table_row(&mut out, &row);
        }
        let mut row = vec![count(*n), "kinformer / kube-runtime".into()];
        for (pick, _) in figures {
            let under = |alloc: Alloc| ratio(cell.figure(&alloc.key(A), pick), cell.figure(&alloc.key(B), pick));
            row.push(format!("{} → {}", under(Alloc::Glibc), under(Alloc::Mimalloc)));
        }
        table_row(&mut out, &row);
    }
    out.push_str(
        "\nThe same client code in two binaries, `bench-client` (glibc's malloc) and `bench-client-mimalloc` \
         (`#[global_allocator]` mimalloc), run in the same rounds as the tables above; heap per object counts \
         requested bytes and is the same under both.\n",
    );
    out
}

/// One client's (or variant's) line in a plot.
struct PlotLine {
    name: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

/// One SVG: list time, list CPU time and heap per object (left to right) against object count.
fn fill_plot(path: &Path, title: &str, series: &[(&str, &BTreeMap<usize, Cell>)]) -> Result<(), BoxError> {
    let root = SVGBackend::new(path, (1500, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 20))?;
    let areas = root.split_evenly((1, 3));
    let clients = [
        (A, RGBColor(0x1f, 0x77, 0xb4)),
        (B, RGBColor(0xd6, 0x27, 0x28)),
        (FLOOR, RGBColor(0x7f, 0x7f, 0x7f)),
    ];
    type Pick = fn(&Outcome) -> Option<f64>;
    // Time per object rather than total time: flat lines that compare at every scale.
    let panels: [(&DrawingArea<SVGBackend, plotters::coord::Shift>, &str, Pick, f64); 3] = [
        (
            &areas[0],
            "list → synced, wall per object (µs)",
            |o| Some(o.list_secs? * 1e6 / o.count.max(1) as f64),
            1.0,
        ),
        (
            &areas[1],
            "list → synced, CPU per object (µs)",
            |o| Some(o.list_cpu_secs? * 1e6 / o.count.max(1) as f64),
            1.0,
        ),
        (&areas[2], "live heap per object (KB)", |o| o.heap_per_object, 1024.0),
    ];
    for (area, label, pick, scale) in panels {
        let mut lines: Vec<PlotLine> = Vec::new();
        for (variant, cells) in series {
            for (client, color) in clients {
                if client == FLOOR && !variant.is_empty() {
                    // The floor decodes the served objects whatever a client strips.
                    continue;
                }
                let points: Vec<(f64, f64)> = cells
                    .iter()
                    .filter_map(|(n, cell)| cell.figure(client, pick).map(|s| (*n as f64, s.median / scale)))
                    .collect();
                if !points.is_empty() {
                    let name = if variant.is_empty() {
                        client.to_string()
                    } else {
                        format!("{client}, {variant}")
                    };
                    lines.push(PlotLine {
                        name,
                        color,
                        dashed: !variant.is_empty(),
                        points,
                    });
                }
            }
        }
        let xs: Vec<f64> = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)).collect();
        let ys: Vec<f64> = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).collect();
        let (xmin, xmax) = (
            xs.iter().copied().fold(f64::INFINITY, f64::min),
            xs.iter().copied().fold(0.0, f64::max),
        );
        let ymax = ys.iter().copied().fold(0.0, f64::max) * 1.1;
        if xs.is_empty() || ymax <= 0.0 {
            continue;
        }
        let mut chart = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .caption(label, ("sans-serif", 15))
            .build_cartesian_2d((xmin * 0.8..xmax * 1.25).log_scale(), 0.0..ymax)?;
        chart
            .configure_mesh()
            .x_desc("objects")
            .x_label_formatter(&|x| count(x.round() as usize))
            .draw()?;
        for PlotLine {
            name,
            color,
            dashed,
            points,
        } in lines
        {
            let style = if dashed {
                color.mix(0.55).stroke_width(2)
            } else {
                color.stroke_width(2)
            };
            chart
                .draw_series(LineSeries::new(points.clone(), style))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// W4: `bench/examples/bench-readers.rs`, reads from 4 reader threads while a relist of `count`
/// ConfigMaps is applied, kinformer and kube-runtime alternating. Returns the section and the
/// goal's row.
fn readers_workload(count: usize, rounds: usize) -> Result<(String, String, Option<bool>), BoxError> {
    let mut cell = Cell::default();
    let limit = Duration::from_secs(120 + count as u64 / 1_000);
    for round in 0..rounds {
        for client in if round % 2 == 0 { [A, B] } else { [B, A] } {
            let args = strings(&["--client", client, "--count", &count.to_string(), "--readers", "4"]);
            let line = run_example_line("bench-readers", &args, limit)?;
            let value: serde_json::Value = serde_json::from_str(&line)?;
            let mut outcome = Outcome {
                client: client.to_string(),
                workload: "readers".into(),
                count,
                ..Outcome::default()
            };
            if let Some(fields) = value.as_object() {
                for (key, v) in fields {
                    if let Some(v) = v.as_f64() {
                        outcome.extra.insert(key.clone(), v);
                    }
                }
            }
            let e = &outcome.extra;
            eprintln!(
                "  readers {client:>12}: relist {:.0} ms, {} reads, p50 {:.1} µs, p99 {:.1} µs, max {:.0} µs",
                e.get("relist_ms").copied().unwrap_or(f64::NAN),
                e.get("reads").copied().unwrap_or(0.0),
                e.get("p50_us").copied().unwrap_or(f64::NAN),
                e.get("p99_us").copied().unwrap_or(f64::NAN),
                e.get("max_us").copied().unwrap_or(f64::NAN),
            );
            cell.by_client.entry(client.to_string()).or_default().push(outcome);
        }
    }
    let extra = |key: &'static str| move |o: &Outcome| o.extra.get(key).copied();
    let us = |v: f64| {
        if v >= 1000.0 {
            format!("{:.2} ms", v / 1e3)
        } else {
            format!("{v:.1} µs")
        }
    };
    let ms = |v: f64| format!("{v:.0} ms");
    let mut out = format!(
        "\n#### W4 readers during a relist: {} ConfigMaps relisted, 4 reader threads (in process, no server)\n\n",
        crate::count(count)
    );
    out.push_str("| | kinformer | kube-runtime | kinformer / kube-runtime |\n|---|---|---|---|\n");
    type Row<'a> = (&'a str, &'static str, &'a dyn Fn(f64) -> String);
    let rows: [Row; 7] = [
        ("relist, start → visible to readers", "relist_ms", &ms),
        ("CPU over the relist (user + system)", "cpu_ms", &ms),
        ("read p50", "p50_us", &us),
        ("read p99", "p99_us", &us),
        ("read p99.9", "p999_us", &us),
        ("read max", "max_us", &us),
        ("reads timed", "reads", &|v: f64| format!("{v:.0}")),
    ];
    for (label, key, unit) in rows {
        let (a, b) = (cell.figure(A, extra(key)), cell.figure(B, extra(key)));
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} |",
            fmt_range(a, unit),
            fmt_range(b, unit),
            ratio(a, b)
        );
    }
    out.push_str(
        "\nkinformer: `Lister::get` on an informer whose watch ends in a 410, so the reflector relists; \
         kube-runtime: `Store::get` while its `Writer` is fed the same relist (`Init`, `InitApply` × N, \
         `InitDone`). Readers are paced (a short sleep between reads); a read held past a reader's pace \
         also counts the reads it held up (coordinated omission corrected), so p99 shows a stall.\n",
    );
    let p99 = cell.figure(A, extra("p99_us"));
    let (a, b) = (p99, cell.figure(B, extra("p99_us")));
    let measured = format!("read p99 {} (kube-runtime {})", fmt_range(a, us), fmt_range(b, us));
    Ok((out, measured, p99.map(|p| p.median < 1000.0)))
}

/// W5 and W6: `bench/examples/bench-kinds.rs`, live heap per object and list → synced for every
/// kind W5 names and W6's projection, one fresh process per (kind, client, round), kinformer and
/// kube-runtime alternating. Returns the section and the two goals' rows.
fn kinds_workload(count: usize, rounds: usize) -> Result<(String, [GoalRow; 2]), BoxError> {
    const KINDS: [(&str, &str); 8] = [
        ("pods", "Pod"),
        (
            "pod-projection",
            "Pod as `PodPlacement` (a projection: labels, `spec.nodeName`, `status.phase`)",
        ),
        ("config-maps", "ConfigMap"),
        ("deployments", "Deployment"),
        ("services", "Service"),
        ("nodes", "Node"),
        ("secrets", "Secret"),
        ("certificates", "Certificate (a CRD, generated by kinformer's codegen)"),
    ];
    let limit = Duration::from_secs(120 + count as u64 / 500);
    let mut cells: Vec<(&str, &str, Cell)> = Vec::new();
    for (kind, name) in KINDS {
        let mut cell = Cell::default();
        let clients: &[&str] = if kind == "pod-projection" { &[A] } else { &[A, B] };
        for round in 0..rounds {
            let mut order = clients.to_vec();
            if round % 2 == 1 {
                order.reverse();
            }
            for client in order {
                let args = strings(&["--kind", kind, "--client", client, "--count", &count.to_string()]);
                let line = run_example_line("bench-kinds", &args, limit)?;
                let value: serde_json::Value = serde_json::from_str(&line)?;
                let outcome = Outcome {
                    client: client.to_string(),
                    workload: "kinds".into(),
                    count,
                    heap_per_object: value.get("heap_per_object").and_then(serde_json::Value::as_f64),
                    list_secs: value.get("list_secs").and_then(serde_json::Value::as_f64),
                    ..Outcome::default()
                };
                eprintln!(
                    "  kinds {kind} {client:>12}: heap/object {}, list {}",
                    outcome.heap_per_object.map_or("—".into(), kb),
                    outcome.list_secs.map_or("—".into(), secs),
                );
                cell.by_client.entry(client.to_string()).or_default().push(outcome);
            }
        }
        cells.push((kind, name, cell));
    }
    let heap = |o: &Outcome| o.heap_per_object;
    let wall = |o: &Outcome| o.list_secs;
    let mut out = format!(
        "\n#### W5, W6 memory per object for every kind, and a projection: {} objects each\n\n",
        crate::count(count)
    );
    out.push_str("| kind | heap per object, kinformer | kube-runtime | kinformer / kube-runtime | list → synced, kinformer | kube-runtime |\n|---|---|---|---|---|---|\n");
    let mut w5 = Vec::new();
    let mut w5_met = true;
    for (kind, name, cell) in &cells {
        let (a, b) = (cell.figure(A, heap), cell.figure(B, heap));
        table_row(
            &mut out,
            &[
                name.to_string(),
                fmt_range(a, kb),
                fmt_range(b, kb),
                ratio(a, b),
                fmt_range(cell.figure(A, wall), secs),
                fmt_range(cell.figure(B, wall), secs),
            ],
        );
        if *kind != "pod-projection" {
            let r = median_ratio(cell, A, B, heap);
            w5_met &= r.is_some_and(|r| r <= 1.0);
            w5.push(format!("{} {}", name.split(' ').next().unwrap_or(name), times(r)));
        }
    }
    out.push_str(
        "\nEach run is a process of its own (`bench-kinds --kind K --client C`) listing from an in-process \
         server of pre-encoded pages, as `bench-server` serves; heap per object is the live heap's growth \
         from before the informer (or watcher) started to the synced cache, over the object count.\n",
    );
    let pods = cells.iter().find(|(k, _, _)| *k == "pods").map(|(_, _, c)| c);
    let projection = cells.iter().find(|(k, _, _)| *k == "pod-projection").map(|(_, _, c)| c);
    let w6 = match (pods, projection) {
        (Some(pods), Some(projection)) => {
            let per_pod = projection.figure(A, heap);
            let list = match (projection.figure(A, wall), pods.figure(A, wall)) {
                (Some(p), Some(f)) if f.median > 0.0 => Some(p.median / f.median),
                _ => None,
            };
            (
                format!(
                    "{} per Pod; list → synced {} the full Pod informer's",
                    fmt_range(per_pod, kb),
                    times(list)
                ),
                per_pod.zip(list).map(|(h, l)| h.median <= 3.0 * 1024.0 && l <= 0.5),
            )
        }
        _ => ("— (not measured)".into(), None),
    };
    Ok((out, [(w5.join(", "), Some(w5_met)), w6]))
}

/// P3: fan-out to 9 counted handlers, without and with one more, stalled, handler (kinformer
/// only). Returns the section and the stalled / unstalled ratio of the slowest counted handler.
fn fanout_workload(events: usize, rounds: usize) -> Result<(String, Option<f64>), BoxError> {
    const FREE: &str = "free";
    const STALLED: &str = "stalled";
    const COUNTED: usize = 9;
    let mut cell = Cell::default();
    let limit = Duration::from_secs(300);
    for round in 0..rounds {
        for stall in if round % 2 == 0 { [false, true] } else { [true, false] } {
            let mut args = strings(&["--client", A, "--workload", "fanout", "--count", "1000"]);
            args.extend(strings(&["--handlers", &COUNTED.to_string()]));
            args.extend(strings(&["--updates", &events.to_string()]));
            if stall {
                args.push("--stalled".into());
            }
            let outcome = run_client(&args, limit)?;
            eprintln!(
                "  fan-out {} events, stalled {stall}: slowest counted handler {}, CPU {}/event",
                count(events),
                outcome.updates_per_sec.map_or("—".into(), per_sec),
                outcome.cpu_per_update.map_or("—".into(), micros),
            );
            let key = if stall { STALLED } else { FREE };
            cell.by_client.entry(key.to_string()).or_default().push(outcome);
        }
    }
    let rate = |o: &Outcome| o.updates_per_sec;
    let cpu = |o: &Outcome| o.cpu_per_update;
    let (f, s) = (cell.figure(FREE, rate), cell.figure(STALLED, rate));
    let (fc, sc) = (cell.figure(FREE, cpu), cell.figure(STALLED, cpu));
    let mut out = format!(
        "\n#### P3 fan-out: {COUNTED} counted handlers, {} events (kinformer only)\n\n",
        count(events)
    );
    out.push_str("| | slowest counted handler | stalled / unstalled | CPU per event | stalled / unstalled |\n|---|---|---|---|---|\n");
    let _ = writeln!(
        out,
        "| {COUNTED} handlers | {} | | {} | |",
        fmt_range(f, per_sec),
        fmt_range(fc, micros)
    );
    let _ = writeln!(
        out,
        "| {COUNTED} handlers + 1 stalled | {} | {} | {} | {} |",
        fmt_range(s, per_sec),
        ratio(s, f),
        fmt_range(sc, micros),
        ratio(sc, fc)
    );
    out.push_str(
        "\nBoth runs time the same nine counted handlers; the stalled run registers a tenth, first, that \
         blocks forever on its first update. A counted handler is timed until it has seen every event; \
         the CPU is the process's, list and events, per event. kube-runtime has no shared-handler fan-out \
         to compare with (one stream per consumer), so this row has no peer.\n",
    );
    let stalled_ratio = match (s, f) {
        (Some(s), Some(f)) if f.median > 0.0 => Some(s.median / f.median),
        _ => None,
    };
    Ok((out, stalled_ratio))
}

/// P4: the workqueue's and the priority queue's interleaved ratios from the workqueue's criterion
/// bench (`-- zzz` skips the groups).
fn workqueue_workload() -> Result<String, BoxError> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "bench",
            "-p",
            "kinformer-workqueue",
            "--bench",
            "throughput",
            "--",
            "zzz",
        ])
        .current_dir(workspace_root())
        .stderr(Stdio::inherit())
        .output()?;
    if !output.status.success() {
        return Err(format!("cargo bench -p kinformer-workqueue failed ({})", output.status).into());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut out = String::from(
        "\n#### P4 workqueue (`cargo bench -p kinformer-workqueue --bench throughput -- zzz`)\n\n\
         Median of 101 interleaved rounds of 10k keys, against one tokio mpsc channel per worker \
         (the smallest hand-off, no dedup): `ratio` is the workqueue's (`Queue`, FIFO) throughput \
         over the channel's; the priority queue (`PriorityQueue`, every key at priority 0, as real \
         changes are added) runs in the same rounds, and `x workqueue` is its throughput over the \
         FIFO queue's. kube-runtime's controller has no standalone rate-limited queue to run in \
         this rig.\n\n| workers | line |\n|---|---|\n",
    );
    for line in text.lines().filter(|l| l.contains("worker(s):")) {
        let (workers, rest) = line.trim().split_once(':').unwrap_or(("?", line));
        let _ = writeln!(out, "| {workers} | {} |", rest.trim());
    }
    Ok(out)
}

/// P5: a controller on ConfigMaps over envtest while the client writes, each reconcile doing
/// `reconcile_ms` of work. Returns the section and its outcomes.
fn e2e_workload(
    rate: usize,
    secs: u64,
    objects: usize,
    rounds: usize,
    reconcile_ms: u64,
) -> Result<(String, Cell), BoxError> {
    let mut cell = Cell::default();
    let limit = Duration::from_secs(secs * 3 + 120);
    for round in 0..rounds {
        // A fresh server per run: the same empty store and watch cache for both clients.
        for client in if round % 2 == 0 { [A, B] } else { [B, A] } {
            let mut server = Command::new(bin_dir()?.join("kinformer-apiserver"));
            // Plain HTTP: P5 measures the clients, not TLS.
            server.args(["--listen", "127.0.0.1:0", "--insecure-http"]);
            let server = Server::start(server)?;
            let mut args = strings(&["--client", client, "--workload", "e2e", "--server", &server.url]);
            args.extend(strings(&[
                "--count",
                &objects.to_string(),
                "--rate",
                &rate.to_string(),
                "--secs",
                &secs.to_string(),
                "--reconcile-ms",
                &reconcile_ms.to_string(),
            ]));
            let outcome = run_client(&args, limit)?;
            let e = &outcome.extra;
            eprintln!(
                "  e2e, {reconcile_ms} ms reconcile, {client:>12}: {:.0} writes/s, p50 {:.2} ms, p99 {:.2} ms, CPU {:.2} s, {} of {} writes seen",
                e.get("writes_per_sec").copied().unwrap_or(0.0),
                e.get("p50_ms").copied().unwrap_or(f64::NAN),
                e.get("p99_ms").copied().unwrap_or(f64::NAN),
                e.get("cpu_secs").copied().unwrap_or(f64::NAN),
                e.get("writes_seen").copied().unwrap_or(0.0),
                e.get("writes").copied().unwrap_or(0.0),
            );
            cell.by_client.entry(client.to_string()).or_default().push(outcome);
            drop(server);
        }
    }
    let ms = |v: f64| format!("{v:.2} ms");
    let extra = |key: &'static str| move |o: &Outcome| o.extra.get(key).copied();
    let work = if reconcile_ms == 0 {
        "an empty reconcile".to_string()
    } else {
        format!("a {reconcile_ms} ms reconcile")
    };
    let mut out = format!(
        "\n#### P5 end-to-end: a controller on {objects} ConfigMaps, {work}, {rate} patches/s for {secs} s (envtest)\n\n"
    );
    out.push_str("| | kinformer | kube-runtime | kinformer / kube-runtime |\n|---|---|---|---|\n");
    for (label, key) in [
        ("p50 latency", "p50_ms"),
        ("p99 latency", "p99_ms"),
        ("max latency", "max_ms"),
    ] {
        let (a, b) = (cell.figure(A, extra(key)), cell.figure(B, extra(key)));
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} |",
            fmt_range(a, ms),
            fmt_range(b, ms),
            ratio(a, b)
        );
    }
    let rate_fmt = |v: f64| format!("{v:.0}/s");
    let (a, b) = (
        cell.figure(A, extra("writes_per_sec")),
        cell.figure(B, extra("writes_per_sec")),
    );
    let _ = writeln!(
        out,
        "| patches answered | {} | {} | |",
        fmt_range(a, rate_fmt),
        fmt_range(b, rate_fmt)
    );
    let share = |o: &Outcome| {
        let (seen, writes) = (o.extra.get("writes_seen")?, o.extra.get("writes")?);
        Some(100.0 * seen / writes.max(1.0))
    };
    let pct = |v: f64| format!("{v:.1}%");
    let _ = writeln!(
        out,
        "| patches a reconcile saw | {} | {} | |",
        fmt_range(cell.figure(A, share), pct),
        fmt_range(cell.figure(B, share), pct)
    );
    let (a, b) = (cell.figure(A, extra("cpu_secs")), cell.figure(B, extra("cpu_secs")));
    let _ = writeln!(
        out,
        "| CPU, client process (writes and controller) | {} | {} | {} |",
        fmt_range(a, crate::secs),
        fmt_range(b, crate::secs),
        ratio(a, b)
    );
    if reconcile_ms == 0 {
        out.push_str(
            "\nLatency: from a patch's response to the first reconcile call that read that patch's value, \
             both in the client's process. A patch superseded by the next one before any reconcile read it \
             has no latency (the controllers coalesce by key, as they should); the row below the rates says \
             how many were seen. Each client uses its defaults (kinformer: 1 worker; kube-runtime: unbounded \
             concurrency). kube-runtime's controller schedules every reconcile through its scheduler, a \
             `tokio_util` `DelayQueue` whose deadlines are rounded up to the next whole millisecond of \
             tokio's timer, so even a reconcile due now waits for the next millisecond tick: its latency \
             here is mostly that granularity. kinformer's queue hands a ready key to a waiting worker \
             without a timer.\n",
        );
    } else {
        out.push_str(&format!(
            "\nThe same as above, with {reconcile_ms} ms of work in each reconcile (a blocking sleep on \
             tokio's blocking pool, as a reconcile waiting on I/O would, in both controllers) and {rate} \
             patches/s, so kinformer's single default worker is busy about half the time. Latency still \
             ends when a reconcile reads the patch, before its work: what the work adds is the wait for \
             reconciles in flight (kinformer's worker busy with another key; kube-runtime runs them \
             concurrently), against which kube-runtime's millisecond timer granularity is a smaller \
             share.\n"
        ));
    }
    Ok((out, cell))
}

/// P6: the priority queue against the plain FIFO queue, kinformer only (kube-runtime has no
/// priority queue): `objects` ConfigMaps listed at start, one worker, a 1 ms reconcile, `changes`
/// objects changed while the backlog drains (`bench/examples/bench-priority.rs`).
fn priority_workload(objects: usize, changes: usize, rounds: usize) -> Result<(String, Cell), BoxError> {
    let mut cell = Cell::default();
    // Creating the objects, then a drain of objects × 1 ms, with room to spare.
    let limit = Duration::from_secs(120) + Duration::from_millis(10 * objects as u64);
    for round in 0..rounds {
        for queue in if round % 2 == 0 {
            [PRIORITY, FIFO]
        } else {
            [FIFO, PRIORITY]
        } {
            // A fresh server per run: the same store for both queues.
            let mut server = Command::new(bin_dir()?.join("kinformer-apiserver"));
            server.args(["--listen", "127.0.0.1:0", "--insecure-http"]);
            let server = Server::start(server)?;
            let mut args = strings(&[
                "--server",
                &server.url,
                "--count",
                &objects.to_string(),
                "--changes",
                &changes.to_string(),
            ]);
            if queue == FIFO {
                args.push("--fifo".into());
            }
            let outcome = run_example("bench-priority", &args, limit)?;
            let e = &outcome.extra;
            eprintln!(
                "  priority {queue:>8}: p99 {:.1} ms, {:.0} reconciles/s, drain {:.1} s, {:.1} CPU s, {} of {} changes seen",
                e.get("p99_ms").copied().unwrap_or(f64::NAN),
                e.get("reconciles_per_sec").copied().unwrap_or(f64::NAN),
                e.get("drain_secs").copied().unwrap_or(f64::NAN),
                e.get("cpu_secs").copied().unwrap_or(f64::NAN),
                e.get("changes_seen").copied().unwrap_or(0.0),
                e.get("changes").copied().unwrap_or(0.0),
            );
            cell.by_client.entry(queue.to_string()).or_default().push(outcome);
            drop(server);
        }
    }
    let extra = |key: &'static str| move |o: &Outcome| o.extra.get(key).copied();
    let ms = |v: f64| {
        if v >= 1000.0 {
            secs(v / 1e3)
        } else {
            format!("{v:.1} ms")
        }
    };
    let mut out = format!(
        "\n#### P6 priority queue: {} ConfigMaps listed at start, 1 worker, a 1 ms reconcile, {changes} changed while the backlog drains (envtest; kinformer only, kube-runtime has no priority queue)\n\n",
        count(objects)
    );
    out.push_str("| | priority queue (default) | FIFO queue (`use_priority_queue(false)`) | priority / FIFO |\n|---|---|---|---|\n");
    let row = |out: &mut String, label: &str, key: &'static str, unit: &dyn Fn(f64) -> String| {
        let (a, b) = (cell.figure(PRIORITY, extra(key)), cell.figure(FIFO, extra(key)));
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {} |",
            fmt_range(a, unit),
            fmt_range(b, unit),
            ratio(a, b)
        );
    };
    row(&mut out, "p50 change → reconcile", "p50_ms", &ms);
    row(&mut out, "p99 change → reconcile", "p99_ms", &ms);
    row(&mut out, "max change → reconcile", "max_ms", &ms);
    row(&mut out, "reconciles/s", "reconciles_per_sec", &|v| format!("{v:.0}/s"));
    row(&mut out, "drain, wall", "drain_secs", &secs);
    row(&mut out, "drain, CPU (user + system)", "cpu_secs", &secs);
    let seen = |o: &Outcome| Some(*o.extra.get("changes_seen")? / o.extra.get("changes")?.max(1.0) * 100.0);
    let pct = |v: f64| format!("{v:.0}%");
    let _ = writeln!(
        out,
        "| changes reconciled | {} | {} | |",
        fmt_range(cell.figure(PRIORITY, seen), pct),
        fmt_range(cell.figure(FIFO, seen), pct)
    );
    out.push_str(
        "\nLatency: from a patch's response to the first reconcile that read the patched value. The \
         initial list enqueues every object at low priority (-100, controller-runtime's), a change at 0, \
         so with the priority queue a change waits for the reconcile in flight only; with the FIFO queue \
         it waits for the backlog ahead of its key. Drain: from the first reconcile until every object \
         was reconciled and every change seen; CPU: the client process's. Goal: p99 < 50 ms with the \
         priority queue, reconciles/s within 10% of the FIFO queue's.\n",
    );
    Ok((out, cell))
}

fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU".to_string(), |(_, m)| m.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!("{cores} cores ({model}), {mem_gib:.0} GiB")
}

fn locked_version(name: &str) -> String {
    let lock = std::fs::read_to_string(workspace_root().join("Cargo.lock")).unwrap_or_default();
    let needle = format!("name = \"{name}\"\nversion = \"");
    lock.find(&needle)
        .and_then(|at| lock[at + needle.len()..].split('"').next())
        .unwrap_or("?")
        .to_string()
}

/// The goals table: each goal of the performance issue next to the figure of this run that
/// decides it.
#[derive(Default)]
struct Goals {
    rows: Vec<[String; 3]>,
}

impl Goals {
    fn add(&mut self, goal: &str, measured: String, met: Option<bool>) {
        let met = match met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "—",
        };
        self.rows.push([goal.to_string(), measured, met.to_string()]);
    }

    fn table(&self) -> String {
        let mut out = String::from(
            "\n#### Goals (issue #25), against this run\n\n| goal | measured in this run | met? |\n|---|---|---|\n",
        );
        for row in &self.rows {
            table_row(&mut out, row);
        }
        out
    }
}

/// A goal's measured figure and whether it is met (`None`: not decided by this run).
type GoalRow = (String, Option<bool>);

/// `a`'s median over `b`'s, of one figure of one cell.
fn median_ratio(cell: &Cell, a: &str, b: &str, pick: impl Fn(&Outcome) -> Option<f64> + Copy) -> Option<f64> {
    let (a, b) = (cell.figure(a, pick)?, cell.figure(b, pick)?);
    (b.median > 0.0).then(|| a.median / b.median)
}

fn times(r: Option<f64>) -> String {
    r.map_or("—".into(), |r| format!("{r:.2}×"))
}

/// W1–W3 from P1 (ConfigMaps, glibc) and P2 (full Pods).
fn fill_goals(goals: &mut Goals, p1: Option<&BTreeMap<usize, Cell>>, pods: Option<&BTreeMap<usize, Cell>>) {
    let rate = |o: &Outcome| o.updates_per_sec;
    let cpu_update = |o: &Outcome| o.cpu_per_update;
    let list_cpu = |o: &Outcome| o.list_cpu_secs;
    let list_wall = |o: &Outcome| o.list_secs;
    let rss = |o: &Outcome| o.peak_rss.map(|v| v as f64);
    if let Some(p1) = p1 {
        let cells: Vec<(&usize, &Cell)> = p1.iter().filter(|(n, _)| **n >= 10_000).collect();
        let mut met = !cells.is_empty();
        let mut parts = Vec::new();
        for (n, cell) in &cells {
            let (r, c) = (median_ratio(cell, A, B, rate), median_ratio(cell, A, B, cpu_update));
            met &= r.is_some_and(|r| r >= 1.5) && c.is_some_and(|c| c <= 0.7);
            parts.push(format!(
                "{}: rate {}, CPU per update {}",
                count(**n),
                times(r),
                times(c)
            ));
        }
        goals.add(
            "W1 watch: updates applied ≥ 1.5× kube-runtime's rate at 10k and 100k ConfigMaps, CPU per update ≤ 0.7×",
            if parts.is_empty() {
                "— (no scale ≥ 10k)".into()
            } else {
                parts.join("; ")
            },
            (!cells.is_empty()).then_some(met),
        );
        if let Some((n, cell)) = p1.iter().next_back() {
            let r = median_ratio(cell, A, B, rss);
            let (a, b) = (cell.figure(A, rss), cell.figure(B, rss));
            goals.add(
                "W2 peak memory: peak RSS of the 100k ConfigMap run (list, then 100k updates) ≤ 1.0× kube-runtime's",
                format!(
                    "{}{}: {} vs {} ({})",
                    count(*n),
                    if *n == 100_000 { "" } else { " (this run's largest)" },
                    fmt_range(a, mb),
                    fmt_range(b, mb),
                    times(r)
                ),
                r.map(|r| r <= 1.0),
            );
        }
    }
    let w3 = |cells: Option<&BTreeMap<usize, Cell>>, floor_goal: f64| -> (String, Option<bool>) {
        let Some((n, cell)) = cells.and_then(|c| c.iter().next_back()) else {
            return ("— (not run)".into(), None);
        };
        let (c, f) = (
            median_ratio(cell, A, B, list_cpu),
            median_ratio(cell, A, FLOOR, list_wall),
        );
        (
            format!(
                "{}: list CPU {} kube-runtime's; wall {} the floor (kube-runtime {})",
                count(*n),
                times(c),
                times(f),
                times(median_ratio(cell, B, FLOOR, list_wall))
            ),
            c.zip(f).map(|(c, f)| c <= 0.8 && f <= floor_goal),
        )
    };
    let (measured, met) = w3(p1, 2.0);
    goals.add(
        "W3 list, ConfigMaps: list → synced CPU ≤ 0.8× kube-runtime's; wall ≤ 2.0× the single-core decode floor",
        measured,
        met,
    );
    let (measured, met) = w3(pods, 1.3);
    goals.add(
        "W3 list, Pods: list → synced CPU ≤ 0.8× kube-runtime's; wall ≤ 1.3× the floor",
        measured,
        met,
    );
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let started = Instant::now();
    let scales: Vec<usize> = if args.scale.is_empty() {
        if args.quick {
            vec![1_000, 10_000]
        } else {
            vec![1_000, 10_000, 100_000]
        }
    } else {
        args.scale.iter().map(|s| parse_scale(s)).collect::<Result<_, _>>()?
    };
    let pod_scales: Vec<usize> = {
        let mut p: Vec<usize> = scales
            .iter()
            .map(|n| (*n).min(if args.quick { 5_000 } else { 50_000 }))
            .collect();
        p.dedup();
        p
    };
    let rounds = args.rounds.unwrap_or(if args.quick { 2 } else { 5 });
    let run = |w: &str| args.only.iter().any(|o| o == w);
    // A run of some workloads only must not replace the whole report with them.
    let partial = !WORKLOADS.iter().all(|w| run(w));
    let full = !args.quick && !partial;
    let out_dir = if full {
        workspace_root().join("bench/plots")
    } else {
        workspace_root().join("target/bench")
    };
    std::fs::create_dir_all(&out_dir)?;

    let commit = command_output("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !command_output("git", &["status", "--porcelain"]).is_empty();
    if full && dirty && !args.allow_dirty {
        return Err(
            "the working tree has uncommitted changes (`git status`): a full run reports the commit it \
                    measured, so commit first, or pass --allow-dirty (the report then says so)"
                .into(),
        );
    }
    let mut report = String::new();
    let _ = writeln!(report, "### Side by side with kube-runtime (`{}`)\n", args.command);
    let _ = writeln!(
        report,
        "- machine: {}; date: {}; commit: {commit}{}\n- versions: {}, kube / kube-runtime {}, k8s-openapi {}, serde_json {}, mimalloc {}; release profile\n- {rounds} rounds per cell, kinformer and kube-runtime alternating (who goes first swaps each round), each run in a process of its own; figures are medians (min–max); CPU: the client process's user + system seconds over the same interval, all threads\n- allocator: glibc's malloc unless a table says otherwise (P1 runs both clients with mimalloc too)\n- server: `bench-server`, pre-encoded pages of {} objects and pre-encoded watch events (P1–P2); envtest (P5, P6)\n- floor: serde_json decoding the same pages into `ObjectList<K>`, warm, one thread, best of 3",
        machine(),
        command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        if dirty { " (with uncommitted changes)" } else { "" },
        command_output("rustc", &["-V"]),
        locked_version("kube-runtime"),
        locked_version("k8s-openapi"),
        locked_version("serde_json"),
        locked_version("mimalloc"),
        kinformer_bench::PAGE_SIZE,
    );
    if args.quick {
        report.push_str("- **quick run** (`--quick`: small scales, 2 rounds, a 5-second P5, a 2k-object P6): a smoke test of the harness; its figures are not the goals' measurements\n");
    }

    let mut goals = Goals::default();
    let mut sections = String::new();
    let mut p1 = None;
    let mut pods = None;
    if run("p1") {
        eprintln!("P1 cache fill: ConfigMaps, glibc and mimalloc");
        let cells = fill_workload(
            "config-maps",
            &scales,
            rounds,
            true,
            false,
            &[Alloc::Glibc, Alloc::Mimalloc],
        )?;
        sections.push_str(&fill_table(
            "P1 cache fill: ConfigMaps (~1.2 KB), list → synced, then as many updates",
            &cells,
            true,
        ));
        sections.push_str(
            "\nkinformer: a factory informer with one handler that counts, declared non-blocking as a \
             controller's enqueue handler is; kube-runtime: `reflector(store, watcher(api, Config::default()))` \
             and one consumer of its stream. Synced: the handler has seen every listed object (the stream's \
             `InitDone`); updates: from the release of the server's watch events until the consumer has seen \
             them all.\n",
        );
        sections.push_str(&alloc_table(&cells));
        fill_plot(
            &out_dir.join("p1-configmaps.svg"),
            "P1: ConfigMaps, list → synced and heap, per object",
            &[("", &cells)],
        )?;
        sections.push_str("\n![P1](bench/plots/p1-configmaps.svg)\n");
        p1 = Some(cells);
    }
    if run("p2") {
        eprintln!("P2 memory: Pods");
        let full = fill_workload("pods", &pod_scales, rounds, false, false, &[Alloc::Glibc])?;
        let stripped = fill_workload("pods", &pod_scales, rounds, false, true, &[Alloc::Glibc])?;
        let metadata = fill_workload("pod-metadata", &pod_scales, rounds, false, true, &[Alloc::Glibc])?;
        sections.push_str(&fill_table(
            "P2 memory: Pods (~4.3 KB) with managedFields",
            &full,
            false,
        ));
        sections.push_str(&fill_table(
            "P2 memory: Pods, managedFields stripped by the client (kinformer's `strip_managed_fields`, kube-runtime's `.modify`); the floor keeps them",
            &stripped,
            false,
        ));
        sections.push_str(&fill_table(
            "P2 memory: Pods, metadata only (kinformer's `metadata_informer_for::<Pod>()`, kube-runtime's `watcher` on `Api<PartialObjectMeta<Pod>>`; the server answers `PartialObjectMetadataList`), managedFields stripped by the client; the floor decodes `PartialObjectMeta<Pod>` with them",
            &metadata,
            false,
        ));
        fill_plot(
            &out_dir.join("p2-pods.svg"),
            "P2: Pods, list → synced and heap, per object (pale: managedFields stripped)",
            &[("", &full), ("stripped", &stripped)],
        )?;
        sections.push_str("\n![P2](bench/plots/p2-pods.svg)\n");
        pods = Some(full);
    }
    fill_goals(&mut goals, p1.as_ref(), pods.as_ref());
    const W4: &str =
        "W4 readers: `Lister::get` / `ctx.get` p99 < 1 ms from 4 readers while a 100k-object relist is applied";
    if run("readers") {
        eprintln!("W4 readers during a relist");
        let objects = if args.quick { 20_000 } else { 100_000 };
        let (section, measured, met) = readers_workload(objects, rounds)?;
        sections.push_str(&section);
        let at = if objects == 100_000 {
            String::new()
        } else {
            format!(" ({} objects in this run)", count(objects))
        };
        goals.add(W4, format!("{measured}{at}"), met);
    } else {
        goals.add(W4, "— (not run)".into(), None);
    }
    const W5: &str = "W5 memory per object ≤ kube-runtime's for Pod, ConfigMap, Deployment, Service, Node, Secret and a generated CRD";
    const W6: &str = "W6 projections: ≤ 3 KB per Pod, list → synced ≤ 0.5× the full Pod informer's";
    if run("kinds") {
        eprintln!("W5/W6 memory per kind, projections");
        let objects = if args.quick { 2_000 } else { 10_000 };
        let (section, [(w5, w5_met), (w6, w6_met)]) = kinds_workload(objects, rounds)?;
        sections.push_str(&section);
        goals.add(W5, w5, w5_met);
        goals.add(W6, w6, w6_met);
    } else {
        goals.add(W5, "— (not run)".into(), None);
        goals.add(W6, "— (not run)".into(), None);
    }
    if run("p3") {
        eprintln!("P3 fan-out");
        let events = if args.quick { 100_000 } else { 1_000_000 };
        let (section, stalled) = fanout_workload(events, rounds)?;
        sections.push_str(&section);
        goals.add(
            "P3 one stalled handler: the other handlers within 10% of their unstalled throughput",
            format!("stalled / unstalled {}", times(stalled)),
            stalled.map(|r| r >= 0.9),
        );
    }
    if run("p4") {
        eprintln!("P4 workqueue");
        sections.push_str(&workqueue_workload()?);
    }
    if run("p5") {
        eprintln!("P5 end-to-end");
        let (secs, r) = if args.quick { (5, 1) } else { (30, rounds) };
        let (section, cell) = e2e_workload(1000, secs, 1000, r, 0)?;
        sections.push_str(&section);
        let p99 = |o: &Outcome| o.extra.get("p99_ms").copied();
        let (a, b) = (cell.figure(A, p99), cell.figure(B, p99));
        goals.add(
            "P5 p99 patch → reconcile < 10 ms and ≤ kube-runtime's",
            format!(
                "{} vs {}",
                fmt_range(a, |v| format!("{v:.2} ms")),
                fmt_range(b, |v| format!("{v:.2} ms"))
            ),
            a.zip(b).map(|(a, b)| a.median < 10.0 && a.median <= b.median),
        );
        let (section, _) = e2e_workload(500, secs, 1000, r, 1)?;
        sections.push_str(&section);
    }
    if run("p6") {
        eprintln!("P6 priority queue");
        let (objects, r) = if args.quick { (2_000, 1) } else { (50_000, rounds) };
        let (section, cell) = priority_workload(objects, 200, r)?;
        sections.push_str(&section);
        let p99 = |o: &Outcome| o.extra.get("p99_ms").copied();
        let per_sec = |o: &Outcome| o.extra.get("reconciles_per_sec").copied();
        let p = cell.figure(PRIORITY, p99);
        let r = median_ratio(&cell, PRIORITY, FIFO, per_sec);
        goals.add(
            "P6 priority queue: p99 change → reconcile < 50 ms, reconciles/s within 10% of the FIFO queue's",
            format!(
                "p99 {}; reconciles/s {} the FIFO queue's",
                fmt_range(p, |v| format!("{v:.1} ms")),
                times(r)
            ),
            p.zip(r).map(|(p, r)| p.median < 50.0 && r >= 0.9),
        );
    }
    report.push_str(&goals.table());
    report.push_str(&sections);
    let _ = writeln!(report, "\nThe whole run took {:.0} s.", started.elapsed().as_secs_f64());

    let moved = command_output("git", &["rev-parse", "--short", "HEAD"]) != commit;
    if !full || moved {
        let name = if args.quick {
            "BENCHMARKS.quick.md"
        } else if partial {
            "BENCHMARKS.partial.md"
        } else {
            "BENCHMARKS.moved.md"
        };
        let path = workspace_root().join("target/bench").join(name);
        std::fs::create_dir_all(path.parent().unwrap_or(&out_dir))?;
        std::fs::write(&path, &report)?;
        if moved {
            return Err(format!(
                "HEAD moved from {commit} during the run: the report went to {} instead of BENCHMARKS.md",
                path.display()
            )
            .into());
        }
        eprintln!(
            "wrote {} and its plots (a quick or partial run leaves BENCHMARKS.md alone)",
            path.display()
        );
    } else {
        let path = workspace_root().join("BENCHMARKS.md");
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let block = format!("{BEGIN}\n{report}{END}");
        let new = match (old.find(BEGIN), old.find(END)) {
            (Some(b), Some(e)) if e > b => format!("{}{block}{}", &old[..b], &old[e + END.len()..]),
            _ => match old.split_once('\n') {
                Some((title, rest)) => format!("{title}\n\n{block}\n{rest}"),
                None => format!("# Benchmarks\n\n{block}\n"),
            },
        };
        std::fs::write(&path, new)?;
        eprintln!("wrote {} and {}", path.display(), out_dir.display());
    }
    println!("{report}");
    Ok(())
}
