//! The `metrics` feature: what a known sequence of operations counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use parking_lot::Mutex;
use redguard::{Error, LockOptions, Locker};

use crate::server::RedisServer;
use crate::{eventually, in_child_process};

#[test]
fn a_known_sequence_counts_what_was_done() {
    in_child_process("stats::counts_child");
}

/// Every series, by name and labels (`name{k=v,...}`): counters and gauges by value,
/// histograms by how many values they were given.
#[derive(Default)]
struct Series(Mutex<HashMap<String, f64>>);

struct Handle(&'static Series, String);

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        *self.0.0.lock().entry(self.1.clone()).or_default() += value as f64;
    }
    fn absolute(&self, value: u64) {
        self.0.0.lock().insert(self.1.clone(), value as f64);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        *self.0.0.lock().entry(self.1.clone()).or_default() += value;
    }
    fn decrement(&self, value: f64) {
        *self.0.0.lock().entry(self.1.clone()).or_default() -= value;
    }
    fn set(&self, value: f64) {
        self.0.0.lock().insert(self.1.clone(), value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, _: f64) {
        *self.0.0.lock().entry(self.1.clone()).or_default() += 1.0;
    }
}

struct Recording(&'static Series);

impl Recording {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        let labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        Arc::new(Handle(
            self.0,
            format!("{}{{{}}}", key.name(), labels.join(",")),
        ))
    }
}

impl Recorder for Recording {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

static SERIES: std::sync::LazyLock<Series> = std::sync::LazyLock::new(Series::default);

fn value(name: &str) -> f64 {
    SERIES.0.lock().get(name).copied().unwrap_or(0.0)
}

#[test]
#[ignore = "run by a_known_sequence_counts_what_was_done"]
fn counts_child() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    metrics::set_global_recorder(Recording(&SERIES)).unwrap();
    let server = RedisServer::start();
    let (one, other) = (
        crate::locker(&server),
        Locker::connect(server.url()).unwrap(),
    );

    one.lock(&["a"]).unwrap().release().unwrap();
    let held = one.lock(&["a"]).unwrap();
    assert!(other.try_lock(&["a"]).unwrap().is_none());
    let waited = other.lock_with(
        &["a"],
        LockOptions::default().timeout(Duration::from_millis(100)),
    );
    assert!(matches!(waited, Err(Error::NotObtained)));
    drop(held);
    one.read(&["r"]).unwrap().release().unwrap();
    one.semaphore("s", 2)
        .unwrap()
        .acquire()
        .unwrap()
        .release()
        .unwrap();
    server.query::<u32>(&["RPUSH", "list", "x"]);
    assert!(one.try_lock(&["list"]).is_err());

    let lost = one
        .lock_with(
            &["gone"],
            LockOptions::default().ttl(Duration::from_millis(300)),
        )
        .unwrap();
    server.query::<u32>(&["DEL", "gone"]);
    eventually(Duration::from_secs(3), "found lost", || lost.is_lost());
    eventually(Duration::from_secs(1), "counted", || {
        value("redguard_lost_total{kind=lock}") == 1.0
    });
    drop(lost);

    let at = |name: &str| value(name);
    assert_eq!(
        at("redguard_acquisitions_total{kind=lock,result=held}"),
        3.0
    );
    assert_eq!(
        at("redguard_acquisitions_total{kind=lock,result=not_obtained}"),
        2.0
    );
    assert_eq!(
        at("redguard_acquisitions_total{kind=lock,result=error}"),
        1.0
    );
    assert_eq!(
        at("redguard_acquisitions_total{kind=read,result=held}"),
        1.0
    );
    assert_eq!(
        at("redguard_acquisitions_total{kind=permit,result=held}"),
        1.0
    );
    assert_eq!(
        at("redguard_wait_seconds{kind=lock}"),
        3.0,
        "one per lock held"
    );
    assert_eq!(at("redguard_hold_seconds{kind=lock}"), 3.0);
    assert_eq!(at("redguard_hold_seconds{kind=permit}"), 1.0);
    assert!(at("redguard_refreshes_total{result=lost}") >= 1.0);
    assert!(at("redguard_refresh_round_trip_seconds{}") >= 1.0);
    assert!(
        at("redguard_wakeups_total{source=timeout}") >= 1.0,
        "the waiter's delays"
    );
    assert_eq!(at("redguard_holds{}"), 0.0, "every hold given up");
    assert_eq!(at("redguard_waiting{}"), 0.0, "no one in line");
}
