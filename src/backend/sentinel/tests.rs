//! How what the sentinels say moves the master we use: lookups, announcements, and
//! connections of old generations that failed.

use std::time::Duration;

use redis::Client;

use super::known::Sentinels;
use crate::backend::bounds::Bounds;

/// Sentinels on a port where nothing listens: every lookup fails at once.
fn nowhere() -> Sentinels {
    let timeout = Duration::from_millis(100);
    let bounds = Bounds {
        connect: timeout,
        io: timeout,
        checkout: timeout,
    };
    let client = Client::open("redis://127.0.0.1:1/").unwrap();
    Sentinels::new("m", vec![client], Box::new(Client::open), false, bounds)
}

#[test]
fn the_master_never_moves_back_while_it_works_and_stale_connections_change_nothing() {
    let sentinels = nowhere();
    let (a, b) = (("a".to_string(), 1), ("b".to_string(), 2));
    assert_eq!(sentinels.learned(&a, Some(0)), (a.clone(), 1));
    assert_eq!(
        sentinels.learned(&a, Some(0)),
        (a.clone(), 1),
        "the same master"
    );
    // Announced: at least one epoch newer than what it replaced.
    sentinels.announced(&a, &b);
    assert_eq!(sentinels.generation(), 2);
    // A sentinel that has not heard of it yet is not believed.
    assert_eq!(sentinels.learned(&a, Some(0)), (b.clone(), 2));
    assert_eq!(sentinels.learned(&b, Some(1)), (b.clone(), 2));
    // A later failover back to a, told by a lookup.
    assert_eq!(sentinels.learned(&a, Some(2)), (a.clone(), 3));
    // Failures of connections of an older generation change nothing.
    sentinels.replica_seen(2);
    sentinels.failed(2);
    assert_eq!(sentinels.generation(), 3);
    assert!(sentinels.known.lock().trusted);
    // Once the master answered as a replica, the sentinels are believed, whatever the
    // epoch (set up afresh, they count from 0 again).
    sentinels.replica_seen(3);
    assert_eq!(sentinels.generation(), 4);
    assert!(!sentinels.known.lock().trusted);
    assert_eq!(sentinels.learned(&b, Some(0)), (b.clone(), 5));
    assert_eq!(sentinels.known.lock().epoch, 0);
}

#[test]
fn an_announcement_of_another_switch_than_ours_is_not_followed() {
    // No sentinel listens: the lookup the stray announcement triggers fails.
    let sentinels = nowhere();
    let (a, b, c) = (
        ("a".to_string(), 1),
        ("b".to_string(), 2),
        ("c".to_string(), 3),
    );
    sentinels.learned(&c, Some(3));
    sentinels.announced(&a, &b); // late news of an older switch
    assert_eq!(sentinels.known.lock().master, Some(c.clone()));
    assert_eq!(sentinels.generation(), 1);
    sentinels.announced(&c, &a);
    assert_eq!(sentinels.known.lock().master, Some(a));
    assert_eq!(sentinels.generation(), 2);
}
