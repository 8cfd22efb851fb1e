//! `docs/examples/grafana-dashboard.json` (issue 40) asks only for metrics the controller and the
//! agent export: every `byoh_*` name in a panel's or variable's query is one of the families
//! their own registries encode (`# TYPE` lines of `Metrics::encode` once each labelled family has
//! a child, a counter's `_total` and a histogram's `_bucket`, `_count`, `_sum` samples included), so a metric renamed in the code
//! fails here, not on an operator's empty panel.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeSet;

/// The `byoh_*` metric names of an expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("byoh_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The sample names each `# TYPE NAME KIND` line of an OpenMetrics text stands for.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if let ["#", "TYPE", name, kind] = w[..] {
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_count", "_sum"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        }
    }
    names
}

/// Every string value under a key `key` anywhere in `v`.
fn strings_under(v: &serde_json::Value, key: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match x {
                    serde_json::Value::String(s) if k == key => out.push(s.clone()),
                    _ => strings_under(x, key, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings_under(x, key, out)),
        _ => {}
    }
}

#[test]
fn every_metric_the_dashboard_asks_for_is_exported() {
    let path = byoh_tests::agent::repo_root().join("docs/examples/grafana-dashboard.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut queries = Vec::new();
    strings_under(&dashboard, "expr", &mut queries);
    strings_under(&dashboard, "query", &mut queries);
    assert!(queries.len() >= 10, "{queries:?}");

    // A labelled family is encoded once it has a child: one of each, as a running controller
    // has after its first reconciles.
    let controller = byoh_controller::metrics::Metrics::new();
    drop(controller.reconcile("byomachine"));
    controller.failed("byomachine", "kube");
    controller.set_hosts(&[("pool".to_string(), [("free", 1)].into())].into());
    controller.set_agents(&[("0.1.0".to_string(), 1)].into());
    let mut known = exported(&controller.encode());
    known.extend(exported(&byoh_agent::metrics::Metrics::new().encode()));
    assert!(known.contains("byoh_controller_hosts"), "{known:?}");

    let mut asked = BTreeSet::new();
    for q in &queries {
        asked.extend(metric_names(q));
    }
    let unknown: Vec<&String> = asked.iter().filter(|n| !known.contains(*n)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard asks for metrics nobody exports: {unknown:?} (exported: {known:?})"
    );
    // Each family the controller exports has a panel.
    for family in [
        "byoh_controller_hosts",
        "byoh_controller_agents",
        "byoh_controller_claim_duration_seconds_bucket",
        "byoh_controller_reconcile_errors_total",
        "byoh_controller_build_info",
    ] {
        assert!(asked.contains(family), "no panel shows {family}");
    }
}

#[test]
fn metric_names_are_read_from_promql() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(byoh_controller_claim_duration_seconds_bucket[5m])))"
        ),
        ["byoh_controller_claim_duration_seconds_bucket"]
    );
    assert_eq!(
        metric_names("sum(byoh_a{x=\"y\"}) / byoh_b"),
        ["byoh_a", "byoh_b"]
    );
    let text =
        "# TYPE byoh_x counter\nbyoh_x_total 1\n# TYPE byoh_h histogram\n# TYPE byoh_g gauge\n";
    assert_eq!(
        exported(text),
        [
            "byoh_g",
            "byoh_h_bucket",
            "byoh_h_count",
            "byoh_h_sum",
            "byoh_x_total"
        ]
        .map(String::from)
        .into()
    );
}
