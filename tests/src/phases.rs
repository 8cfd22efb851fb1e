//! Durations of the named phases of a long system test (end-to-end tests, Cluster API tests),
//! printed as each ends and as a table at the end (recorded in docs/e2e.md).

use std::io::Write as _;
use std::time::{Duration, Instant};

/// When the current phase began, and the finished phases with their durations.
type PhaseLog = (Option<Instant>, Vec<(String, Duration)>);

/// Durations of named phases, printed as a table.
#[derive(Default)]
pub struct Phases {
    inner: std::sync::Mutex<PhaseLog>,
}

impl Phases {
    /// Starts the first phase.
    pub fn begin(&self) {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0 = Some(Instant::now());
    }
    /// Ends the current phase as `name` and starts the next.
    pub fn done(&self, name: &str) {
        let now = Instant::now();
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let d = inner.0.map_or(Duration::ZERO, |s| now - s);
        let _ = writeln!(std::io::stderr(), "phase: {name}: {:.1} s", d.as_secs_f64());
        inner.1.push((name.to_string(), d));
        inner.0 = Some(now);
    }
    /// The phases and their durations, one line each, and the total.
    pub fn table(&self) -> String {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: Duration = inner.1.iter().map(|(_, d)| *d).sum();
        let mut s =
            String::from("phase                                                        seconds\n");
        for (n, d) in &inner.1 {
            s.push_str(&format!("{n:<60} {:>7.1}\n", d.as_secs_f64()));
        }
        s.push_str(&format!("{:<60} {:>7.1}\n", "total", total.as_secs_f64()));
        s
    }
}
