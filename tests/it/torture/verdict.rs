//! The verdicts drawn from the checker's record, one per primitive: its figures and what
//! broke its invariant. Every check counts only what the checker saw on its one clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::checker::{Checker, Fault, Prim, Section, Sighting};

/// The longest a queued waiter may go without the keys after its predecessor ended, when
/// no fault was in progress (or settling) from the predecessor's start on. A hand-over
/// takes about a millisecond; a lost word is found by the next renewal (a third of the
/// waiter lifetime, 0.5 s).
pub const HAND_OVER_BOUND: Duration = Duration::from_secs(1);
/// At most one in twenty of those may take longer than this: a hand-over is told at once
/// (about a millisecond), not found by the waiter's next renewal (up to half a second).
pub const HAND_OVER_SLOW: Duration = Duration::from_millis(100);

pub struct Verdict {
    pub prim: Prim,
    pub figures: String,
    /// How many things it did (sections, sightings): 0 means it was never exercised.
    pub done: usize,
    pub violations: Vec<String>,
}

/// What the run ended with, besides the checker's record.
pub struct Ending {
    /// The term stored by the last `fenced_set` that landed, read from Redis at the end.
    pub elected: Option<u64>,
    pub limit: u32,
    /// How long after a fault its effects may last (a word lost in it, say).
    pub settle: Duration,
    /// Nothing before this is calm (pools filling, scripts loading).
    pub warmed: Instant,
    /// Reads may be stale while a fault settles (an old master serving until it learns
    /// of the failover): observers' sightings then are not judged.
    pub stale_reads: bool,
}

pub fn verdicts(checker: &Checker, ending: &Ending) -> Vec<Verdict> {
    let of = |prim: Prim| -> Vec<&Section> {
        let mut sections: Vec<&Section> = checker
            .sections
            .iter()
            .filter(|s| s.prim == prim && s.end.is_some())
            .collect();
        sections.sort_by_key(|s| s.start);
        sections
    };
    vec![
        exclusive(
            Prim::Lock,
            &of(Prim::Lock),
            checker.refused_of(Prim::Lock),
            checker,
        ),
        readers_and_writers(&of(Prim::Read), checker),
        permits(
            &of(Prim::Permit),
            ending.limit,
            checker.refused_of(Prim::Permit),
        ),
        queue(checker, &of(Prim::Queue), ending),
        terms(checker, &of(Prim::Term), ending.elected),
        observers(checker, ending),
    ]
}

/// Sections of one resource at a time: `sections` (sorted by start) split by resource.
fn by_resource<'a>(sections: &[&'a Section]) -> Vec<Vec<&'a Section>> {
    let mut by: HashMap<&str, Vec<&Section>> = HashMap::new();
    for section in sections {
        by.entry(&section.resource).or_default().push(section);
    }
    by.into_values().collect()
}

/// Sections (sorted by start) that begin before an earlier one ended.
fn overlapping(sections: &[&&Section]) -> usize {
    overlaps(sections).len()
}

/// Each section (sorted by start) that begins before an earlier one ended, with the one
/// it overlaps.
fn overlaps<'a>(sections: &[&&'a Section]) -> Vec<(&'a Section, &'a Section)> {
    let mut latest: Option<&Section> = None;
    let mut found = Vec::new();
    for section in sections {
        if let Some(earlier) = latest
            && earlier.end.is_some_and(|end| section.start < end)
        {
            found.push((earlier, **section));
        }
        if latest.is_none_or(|l| section.end > l.end) {
            latest = Some(section);
        }
    }
    found
}

/// Two overlapping sections, and the faults and wall-clock steps about them, for a
/// violation's message.
fn told(a: &Section, b: &Section, checker: &Checker) -> String {
    let faults = &checker.faults;
    let origin = faults.first().map_or(a.start, |f| f.start);
    let at = |t: Instant| t.saturating_duration_since(origin).as_millis();
    let (from, to) = (a.start.min(b.start), a.end.max(b.end).unwrap_or(a.start));
    let (before, after) = (Duration::from_secs(2), Duration::from_secs(1));
    let near: Vec<String> = faults
        .iter()
        .filter(|f| f.start < to + after && f.end + before > from)
        .map(|f| format!("{} {}-{} ms", f.kind, at(f.start), at(f.end)))
        .collect();
    let steps: Vec<String> = (checker.clock_steps.iter())
        .filter(|(t, _)| *t < to + after && *t + before > from)
        .map(|(t, ms)| format!("{ms:+} ms at {} ms", at(*t)))
        .collect();
    let span = |s: &Section| {
        let kind = if s.writer { "writer" } else { "reader" };
        let end = s.end.map_or(0, at);
        format!(
            "{} ({kind}, fence {}) {}-{end} ms",
            s.id,
            s.fence,
            at(s.start)
        )
    };
    format!(
        "{} and {}; faults near: {near:?}; wall clock steps near: {steps:?}",
        span(a),
        span(b)
    )
}

/// A lock's invariant: no two sections of a key the lock held throughout overlap; nor do
/// two accepted ones; accepted fences rise; no fence is given twice.
fn exclusive(prim: Prim, sections: &[&Section], refused: u64, checker: &Checker) -> Verdict {
    let mut violations = Vec::new();
    for resource in by_resource(sections) {
        let held: Vec<_> = resource.iter().filter(|s| s.held).collect();
        let accepted: Vec<_> = resource.iter().filter(|s| s.accepted).collect();
        let name = &resource[0].resource;
        for (a, b) in overlaps(&held) {
            let told = told(a, b, checker);
            violations.push(format!("{name}: held at once by the lock: {told}"));
        }
        let n = overlapping(&accepted);
        if n > 0 {
            violations.push(format!("{name}: {n} accepted sections overlapped"));
        }
        let n = accepted
            .windows(2)
            .filter(|w| w[1].fence <= w[0].fence)
            .count();
        if n > 0 {
            violations.push(format!("{name}: {n} accepted fences did not rise"));
        }
        let mut fences: Vec<u64> = resource.iter().map(|s| s.fence).collect();
        fences.sort_unstable();
        let n = fences.windows(2).filter(|w| w[0] == w[1]).count();
        if n > 0 {
            violations.push(format!("{name}: {n} fences given twice"));
        }
    }
    let held = sections.iter().filter(|s| s.held).count();
    let accepted = sections.iter().filter(|s| s.accepted).count();
    Verdict {
        prim,
        figures: format!(
            "{} sections, {accepted} accepted, {held} held throughout ({} whose lease ran \
             out inside), {refused} stale writes refused",
            sections.len(),
            sections.len() - held
        ),
        done: sections.len(),
        violations,
    }
}

/// A read lock's invariant: no writer's section overlaps any other section of its key
/// (among sections held throughout).
fn readers_and_writers(sections: &[&Section], checker: &Checker) -> Verdict {
    let mut violations = Vec::new();
    let mut most_readers = 0;
    for resource in by_resource(sections) {
        let held: Vec<_> = resource.into_iter().filter(|s| s.held).collect();
        for (i, a) in held.iter().enumerate() {
            let end = a.end.unwrap_or(a.start);
            let beside = held[i + 1..].iter().take_while(|b| b.start < end);
            if let Some(b) = beside.clone().find(|b| a.writer || b.writer) {
                let told = told(a, b, checker);
                violations.push(format!(
                    "{}: a writer overlapped another: {told}",
                    a.resource
                ));
            }
        }
        let readers: Vec<_> = held.iter().filter(|s| !s.writer).collect();
        most_readers = most_readers.max(most_at_once(&readers));
    }
    let writers = sections.iter().filter(|s| s.writer).count();
    let held = sections.iter().filter(|s| s.held).count();
    Verdict {
        prim: Prim::Read,
        figures: format!(
            "{} reader and {writers} writer sections, {held} held throughout; up to \
             {most_readers} readers inside at once",
            sections.len() - writers
        ),
        done: sections.len(),
        violations,
    }
}

/// The most sections (sorted by start) inside at once.
fn most_at_once(sections: &[&&Section]) -> usize {
    let mut events: Vec<(Instant, i32)> = Vec::new();
    for s in sections {
        events.push((s.start, 1));
        events.push((s.end.unwrap_or(s.start), -1));
    }
    // At one instant an end comes before a start: they did not overlap.
    events.sort();
    let (mut inside, mut most) = (0i32, 0i32);
    for (_, step) in events {
        inside += step;
        most = most.max(inside);
    }
    most as usize
}

/// A semaphore's invariant: never more than `limit` sections inside at once among the
/// permits that held throughout, nor among the accepted ones; every fence one permit's.
fn permits(sections: &[&Section], limit: u32, refused: u64) -> Verdict {
    let mut violations = Vec::new();
    let held: Vec<_> = sections.iter().filter(|s| s.held).collect();
    let accepted: Vec<_> = sections.iter().filter(|s| s.accepted).collect();
    let (most_held, most_accepted) = (most_at_once(&held), most_at_once(&accepted));
    if most_held > limit as usize {
        violations.push(format!("{most_held} permits held at once, of {limit}"));
    }
    if most_accepted > limit as usize {
        violations.push(format!("{most_accepted} accepted at once, of {limit}"));
    }
    let mut fences: Vec<u64> = sections.iter().map(|s| s.fence).collect();
    fences.sort_unstable();
    let twice = fences.windows(2).filter(|w| w[0] == w[1]).count();
    if twice > 0 {
        violations.push(format!("{twice} fences given to two permits"));
    }
    Verdict {
        prim: Prim::Permit,
        figures: format!(
            "{} sections, {} held throughout, up to {most_held} inside at once (limit \
             {limit}), {refused} stale writes refused",
            sections.len(),
            held.len()
        ),
        done: sections.len(),
        violations,
    }
}

/// Whether no fault was in progress, or settling, at any time from `from` to `to`.
fn calm(faults: &[Fault], from: Instant, to: Instant, ending: &Ending) -> bool {
    from >= ending.warmed
        && !faults
            .iter()
            .any(|f| f.start < to && f.end + ending.settle > from)
}

/// The queue's invariant: a lock's, and no waiter served while another waited before it
/// (seen in the queue with one ticket from before its call began to after it was served);
/// in calm, each waiter served within [`HAND_OVER_BOUND`] of its predecessor's end, and
/// none giving up.
fn queue(checker: &Checker, sections: &[&Section], ending: &Ending) -> Verdict {
    let mut verdict = exclusive(
        Prim::Queue,
        sections,
        checker.refused_of(Prim::Queue),
        checker,
    );
    let mut presences: Vec<_> = checker.presences.iter().collect();
    presences.sort_by_key(|p| p.first);
    let mut passed = 0;
    for served in sections {
        let Some(&called) = checker.calls.get(&served.id) else {
            continue;
        };
        let before = presences.partition_point(|p| p.first < called);
        if let Some(waiting) = presences[..before]
            .iter()
            .find(|p| p.id != served.id && p.last > served.start)
        {
            passed += 1;
            verdict.violations.push(format!(
                "{} was served while {} waited before it",
                served.id, waiting.id
            ));
        }
    }
    let mut by_fence: Vec<_> = sections.to_vec();
    by_fence.sort_by_key(|s| s.fence);
    let mut gaps: Vec<Duration> = Vec::new();
    for pair in by_fence.windows(2) {
        let (before, next) = (pair[0], pair[1]);
        let (Some(ended), Some(&called)) = (before.end, checker.calls.get(&next.id)) else {
            continue;
        };
        let waited = next.fence == before.fence + 1 && called < ended;
        if waited && calm(&checker.faults, before.start, next.start, ending) {
            gaps.push(next.start.saturating_duration_since(ended));
        }
    }
    gaps.sort();
    if let Some(worst) = gaps.last().filter(|g| **g > HAND_OVER_BOUND) {
        verdict.violations.push(format!(
            "a waiter was served {worst:?} after its predecessor ended, in calm"
        ));
    }
    let slow = gaps.iter().filter(|g| **g > HAND_OVER_SLOW).count();
    if gaps.len() >= 20 && slow * 20 > gaps.len() {
        verdict.violations.push(format!(
            "{slow} of {} hand-overs in calm took over {HAND_OVER_SLOW:?}",
            gaps.len()
        ));
    }
    let calm_give_ups = checker
        .gave_up
        .iter()
        .filter(|g| {
            g.called
                .is_some_and(|c| calm(&checker.faults, c, g.at, ending))
        })
        .collect::<Vec<_>>();
    for gave_up in &calm_give_ups {
        let called = gave_up.called.unwrap_or(gave_up.at);
        let after = checker.faults.iter().rfind(|f| f.end < called);
        verdict.violations.push(format!(
            "a wait gave up in calm after {:?}, {:?} after the last fault ({}) ended: {}",
            gave_up.at.saturating_duration_since(called),
            after.map(|f| called.saturating_duration_since(f.end)),
            after.map_or("none", |f| f.kind),
            gave_up.error
        ));
    }
    let at = |q: f64| gaps.get(((gaps.len() as f64 - 1.0) * q) as usize);
    verdict.figures += &format!(
        "; {} waits given up under faults; {} reads of the queue, {} waiters seen in it, \
         {passed} passed; hand-over in calm ({} measured) p50 {:?}, p99 {:?}, max {:?}",
        checker.gave_up.len() - calm_give_ups.len(),
        checker.queue_reads,
        checker.presences.len(),
        gaps.len(),
        at(0.5).copied().unwrap_or_default(),
        at(0.99).copied().unwrap_or_default(),
        gaps.last().copied().unwrap_or_default(),
    );
    verdict
}

/// An election's invariant: a lock's (one leader at a time, terms rising and never given
/// twice), and the last fenced write that landed is the largest term's that wrote.
fn terms(checker: &Checker, sections: &[&Section], elected: Option<u64>) -> Verdict {
    let mut verdict = exclusive(
        Prim::Term,
        sections,
        checker.refused_of(Prim::Term),
        checker,
    );
    let largest_term = sections.iter().map(|s| s.fence).max();
    let wrote = checker.fenced_sets.iter().filter(|(_, ok)| *ok);
    let largest = wrote.clone().map(|(term, _)| *term).max();
    if largest > elected {
        verdict.violations.push(format!(
            "the fenced key holds term {elected:?}, though term {largest:?} wrote it"
        ));
    }
    verdict.figures += &format!(
        "; terms up to {}, {} fenced writes landed and {} refused, {} resigned",
        largest_term.unwrap_or(0),
        wrote.count(),
        checker.fenced_sets.iter().filter(|(_, ok)| !*ok).count(),
        checker.resigned.len(),
    );
    verdict
}

/// An observer never yields a leader after a newer term began, or after it resigned.
fn observers(checker: &Checker, ending: &Ending) -> Verdict {
    let mut begun: Vec<(Instant, u64)> = checker
        .sections
        .iter()
        .filter(|s| s.prim == Prim::Term)
        .map(|s| (s.start, s.fence))
        .collect();
    begun.sort();
    let mut newest = Vec::with_capacity(begun.len());
    for &(_, term) in &begun {
        newest.push(term.max(newest.last().copied().unwrap_or(0)));
    }
    let mut violations = Vec::new();
    let judged = |s: &&Sighting| {
        let settling = |f: &Fault| f.start < s.waited && f.end + ending.settle > s.waited;
        s.term > 0 && !(ending.stale_reads && checker.faults.iter().any(settling))
    };
    for sighting in checker.sightings.iter().filter(judged) {
        let before = begun.partition_point(|(at, _)| *at < sighting.waited);
        let newer = before.checked_sub(1).map_or(0, |i| newest[i]);
        if newer > sighting.term {
            violations.push(format!(
                "an observer yielded term {} after term {newer} began",
                sighting.term
            ));
        }
        if checker
            .resigned
            .get(&sighting.term)
            .is_some_and(|at| *at < sighting.waited)
        {
            violations.push(format!(
                "an observer yielded term {} after it resigned",
                sighting.term
            ));
        }
    }
    let nobody = checker.sightings.iter().filter(|s| s.term == 0).count();
    Verdict {
        prim: Prim::Observe,
        figures: format!(
            "{} changes yielded ({nobody} of them nobody leading)",
            checker.sightings.len()
        ),
        done: checker.sightings.len(),
        violations,
    }
}
