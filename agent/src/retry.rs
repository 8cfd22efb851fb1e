//! Retry delays and periodic timers that do not march in step (issue 40). A fleet enrolled by
//! one Ansible run, or cut off by one API server outage, would otherwise retry, renew its Leases
//! and report in the same second, and keep doing so. Retries back off exponentially with
//! jitter, through crate `backon` (already in the tree: kube-runtime's watchers back off with
//! it); periodic timers start at a random point of their first period, so hosts started
//! together tick apart from then on. (The certificate's renewal point is spread by host name:
//! `identity::renewal_time`.)

use backon::BackoffBuilder as _;
use std::time::Duration;

/// The first retry delay.
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// The delay the doubling stops at, before jitter.
pub const RETRY_CAP: Duration = Duration::from_secs(15);

/// Retry delays of the agent's loops, for ever: 1 s doubling to 15 s, each lengthened by a
/// random fraction of itself, so within [1, 2) s, [2, 4) s, [4, 8) s, [8, 16) s, then [15, 30) s.
/// Start a new one after a success.
pub fn backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(RETRY_MIN)
        .with_max_delay(RETRY_CAP)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The next delay of `delays` ([`backoff`] never ends; the cap's upper bound if it did).
pub fn next(delays: &mut backon::ExponentialBackoff) -> Duration {
    delays.next().unwrap_or(RETRY_CAP * 2)
}

/// When a timer of `period` started now first ticks: a uniformly random point of `[0, period)`.
pub fn first_offset(period: Duration) -> Duration {
    period.mul_f64(rand::random::<f64>())
}

/// A timer ticking every `period`, its first tick at a random point of the first period
/// instead of at once; a tick missed while the loop was busy is delayed, not made up in a
/// burst.
pub fn interval(period: Duration) -> tokio::time::Interval {
    let mut timer =
        tokio::time::interval_at(tokio::time::Instant::now() + first_offset(period), period);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    timer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_one_second_with_up_to_as_much_again_at_random() {
        for _ in 0..100 {
            let mut b = backoff();
            let d: Vec<f64> = (0..8).map(|_| next(&mut b).as_secs_f64()).collect();
            for (i, lo) in [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0, 15.0]
                .iter()
                .enumerate()
            {
                assert!(d[i] >= *lo && d[i] < 2.0 * lo, "{d:?}");
            }
        }
        // Two hosts that fail together do not retry together.
        let (mut a, mut b) = (backoff(), backoff());
        let same = (0..8).filter(|_| next(&mut a) == next(&mut b)).count();
        assert!(same < 8);
    }

    #[test]
    fn timers_started_together_first_tick_apart_within_their_period() {
        let period = Duration::from_secs(10);
        let offsets: Vec<Duration> = (0..1000).map(|_| first_offset(period)).collect();
        assert!(offsets.iter().all(|o| *o < period));
        // Spread over the period: each tenth of it gets some, none most.
        let mut per_tenth = [0usize; 10];
        for o in &offsets {
            per_tenth[(o.as_secs_f64()) as usize] += 1;
        }
        assert!(
            per_tenth.iter().all(|&n| (40..=170).contains(&n)),
            "{per_tenth:?}"
        );
    }
}
