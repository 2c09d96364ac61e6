//! Classifies the recorded requests and samples against the driver's truth and prints the
//! per-phase table (markdown) on stdout; writes the same numbers to `summary.json`.
//!
//! A result belongs to the phase in force when it was sent. A request is **cut by an Envoy
//! restart** (no answer, or an answer cut short, and the node's Envoy was down at some moment of
//! the request, per the driver's `--running` record), else **2xx**, **503**, a **wrong 404** (a
//! version required both when it was sent and when it ended serves the GVR), an **expected 404**
//! (no required version serves it: the API is legitimately gone), or **other** (no answer:
//! timeout, connection error, shed; or any other status). A 503 is also **avoidable** when an
//! apiserver that the node's Envoy could reach served the GVR throughout the request (its own,
//! or a peer's whose Envoy was up too; `running.rs`). The **longest 503 window** is the longest run of consecutive 503s of one node and GVR, from the first one's
//! start to the last one's end. A discovery sample that got a document is **hiding** when it
//! lacks a group-version that a required version serves (both at its start and at its end),
//! and **stale-marked** when it marks any group-version `freshness: Stale`.
//!
//! The latency of the 2xx answers is kept in two classes: **local** (the node's own apiserver
//! was up throughout the request and its release serves the GVR, so no proxy had to go
//! elsewhere) and **peer-served** (it was up throughout and its release does not serve the GVR:
//! another apiserver answered, through whichever proxy the cluster runs). A 2xx while the node's
//! own apiserver stopped or started is in neither class: the record cannot tell who answered.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::Path;

use anyhow::Context;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::running::{Component, Running};
use crate::truth::{self, Catalog, Entry};
use crate::{ReportArgs, RequestRecord, SampleRecord};

const EXAMPLES: usize = 8;

#[derive(Serialize, Default, Debug)]
struct Stats {
    phase: String,
    /// when the phase began (unix ms) and how long it lasted (s)
    start_ms: u64,
    seconds: f64,
    requests: u64,
    ok_2xx: u64,
    unavailable_503: u64,
    /// 503s while an apiserver the node's Envoy could reach served the GVR
    avoidable_503: u64,
    /// of those, the ones while the node's own apiserver was not up throughout
    avoidable_503_local_down: u64,
    wrong_404: u64,
    expected_404: u64,
    cut_by_envoy_restart: u64,
    /// of those, the ones refused or reset while connecting (nothing was sent)
    cut_at_connect: u64,
    other: u64,
    shed: u64,
    longest_503_window_ms: u64,
    longest_503_window: String,
    samples: u64,
    samples_failed: u64,
    hiding_samples: u64,
    stale_marked_samples: u64,
    /// group-versions marked Stale, with how many samples marked each
    stale_gvs: BTreeMap<String, u64>,
    /// the 2xx answers' latency: all of them, local, peer-served (the module's doc)
    latency_2xx: Latency,
    latency_local_2xx: Latency,
    latency_peer_2xx: Latency,
    #[serde(skip)]
    all_ms: Vec<u64>,
    #[serde(skip)]
    local_ms: Vec<u64>,
    #[serde(skip)]
    peer_ms: Vec<u64>,
    wrong_404_examples: Vec<String>,
    avoidable_503_examples: Vec<String>,
    cut_examples: Vec<String>,
    hiding_examples: Vec<String>,
    other_examples: Vec<String>,
}

/// Nearest-rank percentiles of request durations.
#[derive(Serialize, Default, Debug, Clone, Copy, PartialEq)]
struct Latency {
    n: usize,
    p50_ms: u64,
    p99_ms: u64,
    max_ms: u64,
}

impl Latency {
    fn of(ms: &mut [u64]) -> Latency {
        ms.sort_unstable();
        let rank = |q: f64| -> u64 {
            // Nearest rank: the smallest value with at least q of the values at or below it.
            let i = ((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len().max(1)) - 1;
            ms.get(i).copied().unwrap_or(0)
        };
        Latency {
            n: ms.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: ms.last().copied().unwrap_or(0),
        }
    }
}

impl std::fmt::Display for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.n == 0 {
            return write!(f, "none");
        }
        write!(
            f,
            "p50 {} ms, p99 {} ms, max {} ms ({})",
            self.p50_ms, self.p99_ms, self.max_ms, self.n
        )
    }
}

/// Reads JSON lines; a line that does not parse (a write cut short, e.g. by a full disk) is
/// skipped and counted on stderr.
fn read_jsonl<T: DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let (mut out, mut bad) = (Vec::new(), 0usize);
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(rec) => out.push(rec),
            Err(_) => bad += 1,
        }
    }
    if bad > 0 {
        eprintln!(
            "skewgate-load: {}: {bad} unreadable lines skipped",
            path.display()
        );
    }
    Ok(out)
}

fn push_example(v: &mut Vec<String>, s: impl FnOnce() -> String) {
    if v.len() < EXAMPLES {
        v.push(s());
    }
}

/// Reports from the files in `--out`.
pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let requests = read_jsonl(&args.out.join("requests.jsonl"))?;
    let samples = read_jsonl(&args.out.join("samples.jsonl"))?;
    report_records(args, requests, samples)
}

pub fn report_records(
    args: &ReportArgs,
    mut requests: Vec<RequestRecord>,
    samples: Vec<SampleRecord>,
) -> anyhow::Result<()> {
    let catalog = Catalog::load(&args.fixtures)?;
    let text = std::fs::read_to_string(&args.truth)
        .with_context(|| format!("reading {}", args.truth.display()))?;
    let entries = truth::parse(&text);
    anyhow::ensure!(
        !entries.is_empty(),
        "the truth file {} is empty",
        args.truth.display()
    );
    let running = Running::parse(
        &std::fs::read_to_string(&args.running)
            .with_context(|| format!("reading {}", args.running.display()))?,
    );
    requests.sort_by_key(|r| r.t0);
    let settle = args.settle.as_millis() as u64;

    // Phases in the order they began; `end` is not a phase.
    let mut order: Vec<String> = Vec::new();
    let mut stats: BTreeMap<String, Stats> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        if e.phase == "end" {
            continue;
        }
        let end = entries.get(i + 1).map_or(e.at_ms, |n| n.at_ms);
        let s = stats.entry(e.phase.clone()).or_insert_with(|| {
            order.push(e.phase.clone());
            Stats {
                phase: e.phase.clone(),
                start_ms: e.at_ms,
                ..Stats::default()
            }
        });
        s.seconds += end.saturating_sub(e.at_ms) as f64 / 1000.0;
    }
    let phase_of = |t: u64| -> String {
        let e: Option<&Entry> = truth::entry_at(&entries, t);
        match e {
            Some(e) if e.phase != "end" => e.phase.clone(),
            // After `end`: the phase before it.
            _ => entries
                .iter()
                .rev()
                .find(|e| e.phase != "end")
                .map_or_else(String::new, |e| e.phase.clone()),
        }
    };
    let required = |t: u64| truth::required_versions(&entries, t, settle);

    // Runs of 503 per (node, GVR), in send order: (first start, last end, phase of the first).
    let mut runs: BTreeMap<(String, String), (u64, u64, String)> = BTreeMap::new();
    let close_run =
        |stats: &mut BTreeMap<String, Stats>, key: &(String, String), run: (u64, u64, String)| {
            let len = run.1.saturating_sub(run.0);
            if let Some(s) = stats.get_mut(&run.2) {
                if len > s.longest_503_window_ms {
                    s.longest_503_window_ms = len;
                    s.longest_503_window = format!("{} {} from {}", key.0, key.1, run.0);
                }
            }
        };
    for r in &requests {
        let phase = phase_of(r.t0);
        let Some(s) = stats.get_mut(&phase) else {
            continue;
        };
        s.requests += 1;
        let key = (r.node.clone(), r.gvr.clone());
        let failed = r.err.as_deref().is_some_and(|e| !e.starts_with("shed"));
        match r.status {
            _ if failed && running.envoy_down_during(&r.node, r.t0, r.t1) => {
                s.cut_by_envoy_restart += 1;
                if r.err.as_deref().is_some_and(|e| e.starts_with("connect")) {
                    s.cut_at_connect += 1;
                }
                push_example(&mut s.cut_examples, || {
                    format!(
                        "{} {} at {}: {} {}",
                        r.node,
                        r.gvr,
                        r.t0,
                        r.status,
                        r.err.as_deref().unwrap_or("")
                    )
                });
            }
            200..=299 => {
                s.ok_2xx += 1;
                let ms = r.t1.saturating_sub(r.t0);
                s.all_ms.push(ms);
                if let Some(v) = running.up_throughout(&r.node, Component::Apiserver, r.t0, r.t1) {
                    if catalog.serves(&BTreeSet::from([v.to_string()]), &r.gvr) {
                        s.local_ms.push(ms);
                    } else {
                        s.peer_ms.push(ms);
                    }
                }
            }
            503 => {
                s.unavailable_503 += 1;
                let servers = running.servers(&catalog, &r.node, &r.gvr, r.t0, r.t1);
                if !servers.is_empty() {
                    s.avoidable_503 += 1;
                    let local_up = running
                        .up_throughout(&r.node, Component::Apiserver, r.t0, r.t1)
                        .is_some();
                    if !local_up {
                        s.avoidable_503_local_down += 1;
                    }
                    push_example(&mut s.avoidable_503_examples, || {
                        format!(
                            "{} {} at {} (its own apiserver {}; served by {}): {}",
                            r.node,
                            r.gvr,
                            r.t0,
                            if local_up { "up" } else { "down" },
                            servers.into_iter().collect::<Vec<_>>().join(", "),
                            r.message.as_deref().unwrap_or("no Status message")
                        )
                    });
                }
            }
            404 => {
                if catalog.serves(&required(r.t0), &r.gvr)
                    && catalog.serves(&required(r.t1), &r.gvr)
                {
                    s.wrong_404 += 1;
                    push_example(&mut s.wrong_404_examples, || {
                        format!(
                            "{} {} at {} (answered by {})",
                            r.node,
                            r.gvr,
                            r.t0,
                            r.by.as_deref().unwrap_or("?")
                        )
                    });
                } else {
                    s.expected_404 += 1;
                }
            }
            _ => {
                s.other += 1;
                if r.err.as_deref().is_some_and(|e| e.starts_with("shed")) {
                    s.shed += 1;
                }
                push_example(&mut s.other_examples, || {
                    format!(
                        "{} {} at {}: {} {}",
                        r.node,
                        r.gvr,
                        r.t0,
                        r.status,
                        r.err.as_deref().unwrap_or("")
                    )
                });
            }
        }
        if r.status == 503 {
            runs.entry(key)
                .and_modify(|run| run.1 = run.1.max(r.t1))
                .or_insert((r.t0, r.t1, phase));
        } else if let Some(run) = runs.remove(&key) {
            close_run(&mut stats, &key, run);
        }
    }
    for (key, run) in std::mem::take(&mut runs) {
        close_run(&mut stats, &key, run);
    }

    for smp in &samples {
        let Some(s) = stats.get_mut(&phase_of(smp.t0)) else {
            continue;
        };
        s.samples += 1;
        if smp.err.is_some() || smp.status != 200 {
            s.samples_failed += 1;
            continue;
        }
        let present: BTreeSet<&str> = smp.present.iter().map(String::as_str).collect();
        let want_start = catalog.group_versions(&required(smp.t0));
        let want_end = catalog.group_versions(&required(smp.t1));
        let missing: Vec<&String> = want_start
            .intersection(&want_end)
            .filter(|gv| !present.contains(gv.as_str()))
            .collect();
        if !missing.is_empty() {
            s.hiding_samples += 1;
            push_example(&mut s.hiding_examples, || {
                format!("{} at {} lacks {missing:?}", smp.node, smp.t0)
            });
        }
        if !smp.stale.is_empty() {
            s.stale_marked_samples += 1;
            for gv in &smp.stale {
                *s.stale_gvs.entry(gv.clone()).or_default() += 1;
            }
        }
    }

    let mut phases: Vec<Stats> = order.iter().filter_map(|p| stats.remove(p)).collect();
    let mut total = Stats {
        phase: "total".to_string(),
        ..Stats::default()
    };
    for s in &mut phases {
        total.all_ms.extend_from_slice(&s.all_ms);
        total.local_ms.extend_from_slice(&s.local_ms);
        total.peer_ms.extend_from_slice(&s.peer_ms);
        s.latency_2xx = Latency::of(&mut s.all_ms);
        s.latency_local_2xx = Latency::of(&mut s.local_ms);
        s.latency_peer_2xx = Latency::of(&mut s.peer_ms);
    }
    total.latency_2xx = Latency::of(&mut total.all_ms);
    total.latency_local_2xx = Latency::of(&mut total.local_ms);
    total.latency_peer_2xx = Latency::of(&mut total.peer_ms);
    for s in &phases {
        total.seconds += s.seconds;
        total.requests += s.requests;
        total.ok_2xx += s.ok_2xx;
        total.unavailable_503 += s.unavailable_503;
        total.avoidable_503 += s.avoidable_503;
        total.avoidable_503_local_down += s.avoidable_503_local_down;
        total.wrong_404 += s.wrong_404;
        total.expected_404 += s.expected_404;
        total.cut_by_envoy_restart += s.cut_by_envoy_restart;
        total.cut_at_connect += s.cut_at_connect;
        total.other += s.other;
        total.shed += s.shed;
        if s.longest_503_window_ms > total.longest_503_window_ms {
            total.longest_503_window_ms = s.longest_503_window_ms;
            total.longest_503_window = s.longest_503_window.clone();
        }
        total.samples += s.samples;
        total.samples_failed += s.samples_failed;
        total.hiding_samples += s.hiding_samples;
        total.stale_marked_samples += s.stale_marked_samples;
        for (gv, n) in &s.stale_gvs {
            *total.stale_gvs.entry(gv.clone()).or_default() += n;
        }
    }

    println!(
        "| phase | s | requests | 2xx | 503 | avoidable 503 | wrong 404 | expected 404 | cut by Envoy restart | other errors | longest 503 window | discovery samples (failed) | hiding samples | stale-marked samples |"
    );
    println!(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for s in phases.iter().chain(std::iter::once(&total)) {
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} s | {} ({}) | {} | {} |",
            s.phase,
            s.seconds,
            s.requests,
            s.ok_2xx,
            s.unavailable_503,
            s.avoidable_503,
            s.wrong_404,
            s.expected_404,
            s.cut_by_envoy_restart,
            s.other,
            s.longest_503_window_ms as f64 / 1000.0,
            s.samples,
            s.samples_failed,
            s.hiding_samples,
            s.stale_marked_samples
        );
    }
    for s in phases.iter().chain(std::iter::once(&total)) {
        println!(
            "#   {} 2xx latency: all {}; local {}; peer-served {}",
            s.phase, s.latency_2xx, s.latency_local_2xx, s.latency_peer_2xx
        );
    }
    for s in &phases {
        if s.longest_503_window_ms > 0 {
            println!(
                "#   {} longest 503 window: {} ({:.1} s)",
                s.phase,
                s.longest_503_window,
                s.longest_503_window_ms as f64 / 1000.0
            );
        }
        if s.avoidable_503 > 0 {
            println!(
                "#   {} avoidable 503s: {} ({} while the node's own apiserver was down)",
                s.phase, s.avoidable_503, s.avoidable_503_local_down
            );
        }
        if s.cut_by_envoy_restart > 0 {
            println!(
                "#   {} cut by Envoy restart: {} ({} refused or reset while connecting, {} in flight)",
                s.phase,
                s.cut_by_envoy_restart,
                s.cut_at_connect,
                s.cut_by_envoy_restart - s.cut_at_connect
            );
        }
        for (what, ex) in [
            ("wrong 404", &s.wrong_404_examples),
            ("avoidable 503", &s.avoidable_503_examples),
            ("cut by Envoy restart", &s.cut_examples),
            ("hiding", &s.hiding_examples),
            ("other", &s.other_examples),
        ] {
            for e in ex {
                println!("#   {} {what}: {e}", s.phase);
            }
        }
    }
    let rate = if total.seconds > 0.0 {
        total.requests as f64 / total.seconds
    } else {
        0.0
    };
    println!("#   {:.1} requests/s over {:.0} s", rate, total.seconds);
    phases.push(total);
    let summary = serde_json::json!({ "phases": phases, "requests_per_second": rate });
    std::fs::write(
        args.out.join("summary.json"),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    #[test]
    fn latency_is_nearest_rank() {
        let mut ms: Vec<u64> = (1..=200).rev().collect();
        assert_eq!(
            Latency::of(&mut ms),
            Latency {
                n: 200,
                p50_ms: 100,
                p99_ms: 198,
                max_ms: 200
            }
        );
        assert_eq!(Latency::of(&mut [7]).p99_ms, 7);
        assert_eq!(Latency::of(&mut []), Latency::default());
    }

    /// A 2xx is local while the node's own apiserver serves the GVR, peer-served while it runs
    /// a release that does not, and neither while it stops or starts.
    #[test]
    fn latency_local_and_peer_served() {
        let truth = "0 mixed 1.30,1.33\n5000 end\n";
        let running =
            "0 node-1 apiserver ready 1.30\n0 node-2 apiserver ready 1.33\n0 node-1 envoy ready\n\
             0 node-2 envoy ready\n2000 node-1 apiserver stopped\n";
        let v1beta2 = "resource.k8s.io/v1beta2/resourceclaims";
        let mut requests = vec![
            // node-1 (1.30) for pods: local; for v1beta2 (1.33 only): peer-served.
            req(100, "node-1", "v1/pods", 200, None),
            req(200, "node-1", v1beta2, 200, None),
            req(300, "node-2", v1beta2, 200, None),
            // node-1's apiserver stopped: who answered is unknown, in neither class.
            req(2100, "node-1", "v1/pods", 200, None),
        ];
        requests[1].t1 = 200 + 400;
        requests[2].t1 = 300 + 300;
        let summary = summary_of(truth, running, requests);
        let total = &summary["phases"][1];
        assert_eq!(total["phase"], "total");
        // node-1's pods (50 ms) and node-2's v1beta2 (node-2 runs 1.33: 300 ms) are local;
        // node-1's v1beta2 (400 ms) is peer-served; the pods while node-1 stops are in neither.
        assert_eq!(total["latency_local_2xx"]["n"], 2);
        assert_eq!(total["latency_local_2xx"]["p50_ms"], 50);
        assert_eq!(total["latency_local_2xx"]["max_ms"], 300);
        assert_eq!(total["latency_peer_2xx"]["n"], 1);
        assert_eq!(total["latency_peer_2xx"]["p99_ms"], 400);
        assert_eq!(total["latency_2xx"]["n"], 4);
    }

    /// The summary.json `report_records` writes for these records against this truth and
    /// running record (the test fixtures' catalog, no settle time).
    fn summary_of(truth: &str, running: &str, requests: Vec<RequestRecord>) -> serde_json::Value {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = ReportArgs {
            out: dir.path().to_path_buf(),
            truth: dir.path().join("truth"),
            running: dir.path().join("running"),
            fixtures: Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/discovery"),
            settle: Duration::from_millis(0),
        };
        std::fs::write(&args.truth, truth).expect("truth");
        std::fs::write(&args.running, running).expect("running");
        report_records(&args, requests, Vec::new()).expect("report");
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).expect("summary"))
            .expect("json")
    }

    fn req(t0: u64, node: &str, gvr: &str, status: u16, err: Option<&str>) -> RequestRecord {
        RequestRecord {
            t0,
            t1: t0 + 50,
            node: node.to_string(),
            gvr: gvr.to_string(),
            status,
            err: err.map(str::to_string),
            by: None,
            message: None,
        }
    }

    /// node-1's apiserver down from 1000 to 2000, node-2's Envoy restarting from 3000 to 3500;
    /// node-2 runs 1.30 throughout, node-1 comes back as 1.33.
    #[test]
    fn avoidable_503s_and_cut_requests() {
        let truth = "0 baseline 1.30\n900 upgrade 1.30,1.33\n2900 restart 1.30,1.33\n5000 end\n";
        let running = "0 node-1 apiserver ready 1.30\n0 node-2 apiserver ready 1.30\n0 node-1 envoy ready\n\
             0 node-2 envoy ready\n1000 node-1 apiserver stopped\n2000 node-1 apiserver ready 1.33\n\
             3000 node-2 envoy stopped\n3500 node-2 envoy ready\n";
        let v1beta2 = "resource.k8s.io/v1beta2/resourceclaims";
        let requests = vec![
            req(100, "node-1", "v1/pods", 200, None),
            // node-1's apiserver down: pods are node-2's too (avoidable), v1beta2 nobody's.
            req(1100, "node-1", "v1/pods", 503, None),
            req(1200, "node-1", v1beta2, 503, None),
            // In flight when node-1 came back: not up throughout, so not avoidable.
            req(1980, "node-2", v1beta2, 503, None),
            // node-2's apiserver up and serving pods: a 503 from node-2 is avoidable.
            req(2500, "node-2", "v1/pods", 503, None),
            // node-2's Envoy down: cut (refused, in flight), whatever the status.
            req(
                2990,
                "node-2",
                "v1/pods",
                0,
                Some("request: connection closed"),
            ),
            req(
                3100,
                "node-2",
                "v1/pods",
                0,
                Some("connect: Connection refused"),
            ),
            req(3200, "node-2", "v1/pods", 200, Some("body: reset")),
            // node-1 while node-2's Envoy is down: its apiserver is out of reach, so a 503 for
            // what only node-2 serves is not avoidable; a shed tick is not cut.
            req(
                3100,
                "node-1",
                "resource.k8s.io/v1alpha2/resourceclaims",
                503,
                None,
            ),
            req(
                3150,
                "node-2",
                "v1/pods",
                0,
                Some("shed: 256 requests in flight"),
            ),
            // An error after the Envoy is back is not a cut by its restart.
            req(
                3600,
                "node-2",
                "v1/pods",
                0,
                Some("connect: Connection refused"),
            ),
        ];
        let summary = summary_of(truth, running, requests);
        let phase = |name: &str| {
            summary["phases"]
                .as_array()
                .and_then(|p| p.iter().find(|s| s["phase"] == name))
                .cloned()
                .unwrap_or_default()
        };
        let upgrade = phase("upgrade");
        assert_eq!(upgrade["unavailable_503"], 4);
        assert_eq!(upgrade["avoidable_503"], 2);
        assert_eq!(upgrade["avoidable_503_local_down"], 1);
        let restart = phase("restart");
        assert_eq!(restart["cut_by_envoy_restart"], 3);
        assert_eq!(restart["cut_at_connect"], 1);
        assert_eq!(restart["unavailable_503"], 1);
        assert_eq!(restart["avoidable_503"], 0);
        assert_eq!(restart["other"], 2);
        assert_eq!(restart["shed"], 1);
        assert_eq!(phase("total")["requests"], 11);
        // The one 2xx counted: node-1's pods at 100, its own 1.30 serving them (the 200 at 3200
        // was cut by node-2's Envoy restart).
        assert_eq!(phase("baseline")["latency_local_2xx"]["n"], 1);
        assert_eq!(phase("baseline")["latency_peer_2xx"]["n"], 0);
        assert_eq!(phase("total")["latency_local_2xx"]["n"], 1);
    }
}
