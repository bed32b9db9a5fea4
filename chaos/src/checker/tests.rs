//! The checker on states with known defects (and one without).

use super::*;
use crate::config::{
    NS_BATCH, NS_COUNTER, NS_DOWNSTREAM, NS_ENROLL, NS_FLAKY, ROUTE_BATCH, ROUTE_COUNTER,
    ROUTE_ENROLL, ROUTE_FLAKY, ROUTE_LARGE,
};
use crate::logs::MarkTrouble;

fn sent(number: u64, kind: Kind) -> Sent {
    Sent::new(number, kind)
}

fn kv(state: &mut State, ns: &str, key: &str, value: &str) {
    state.kv.insert((ns.into(), key.into()), value.into());
}

fn event(state: &mut State, id: i64, route: &str, source: &str, at_ms: u64) -> String {
    let event_id = format!("ev-{id}");
    state.outbox.push(OutboxRow {
        id,
        event_id: event_id.clone(),
        route: route.into(),
        ordering_key: format!("{route}/{source}"),
        published: true,
        attempts: 0,
        last_error: None,
        created_at: 0,
        published_at: Some(0),
    });
    kv(state, NS_DOWNSTREAM, &format!("seen/{event_id}"), "1");
    state.sink.push(Arrival {
        event_id: event_id.clone(),
        at_ms,
        redelivered: false,
    });
    event_id
}

/// One enrollment, two counter messages on one key, one flaky and one poison message,
/// every effect once.
fn clean() -> State {
    let mut s = State {
        window_ms: 1_000,
        lead_ms: 500,
        drained: true,
        ..State::default()
    };
    let enroll = sent(1, Kind::Enroll);
    let c1 = sent(2, Kind::Counter { key: "hot".into() });
    let c2 = sent(3, Kind::Counter { key: "hot".into() });
    let flaky = sent(4, Kind::Flaky { until: 3 });
    let poison = sent(5, Kind::PoisonJson);
    kv(&mut s, NS_ENROLL, "matricula/1", "{}");
    for i in 0..3 {
        event(&mut s, 1 + i, ROUTE_ENROLL, &enroll.id, 10 + i as u64);
    }
    for (i, c) in [&c1, &c2].into_iter().enumerate() {
        kv(&mut s, NS_COUNTER, &format!("seen/{}", c.id), "1");
        event(&mut s, 10 + i as i64, ROUTE_COUNTER, &c.id, 20);
    }
    kv(&mut s, NS_COUNTER, "counter/hot", "2");
    kv(&mut s, NS_COUNTER, "runs", "2");
    kv(&mut s, NS_FLAKY, &format!("done/{}", flaky.id), "3");
    s.dead_letters.push(DeadLetter {
        route: ROUTE_ENROLL.into(),
        message_id: Some(poison.id.clone()),
        reason: "invalid matricula.confirmada: expected value".into(),
        ..DeadLetter::default()
    });
    for x in [&enroll, &c1, &c2, &flaky, &poison] {
        s.inbox.insert((x.kind.route().into(), x.id.clone()));
    }
    s.sent = vec![enroll, c1, c2, flaky, poison];
    s
}

/// Checks `s`, which must pass.
fn passing(s: &State) -> Findings {
    let f = check(s);
    assert!(f.passed(), "{f:#?}");
    f
}

/// Checks `s`, which must fail.
fn failing(s: &State) -> Findings {
    let f = check(s);
    assert!(!f.passed(), "{f:#?}");
    f
}

/// Checks a clean state after `change`, which must make it fail.
fn failing_after(change: impl FnOnce(&mut State)) -> Findings {
    let mut s = clean();
    change(&mut s);
    failing(&s)
}

/// Removes the flaky input's effect from `s`; returns its id.
fn undo_flaky(s: &mut State) -> String {
    let flaky = s.sent[3].id.clone();
    s.kv.remove(&(NS_FLAKY.into(), format!("done/{flaky}")));
    flaky
}

#[test]
fn a_clean_state_passes() {
    let f = passing(&clean());
    assert_eq!((f.inputs, f.events, f.dead_letters), (5, 5, 1));
}

#[test]
fn one_lost_message_and_one_duplicate_effect_are_both_reported() {
    let mut s = clean();
    // The second counter message's effects vanished (and its event with them)...
    let lost = s.sent[2].id.clone();
    s.kv.remove(&(NS_COUNTER.into(), format!("seen/{lost}")));
    s.kv.insert((NS_COUNTER.into(), "counter/hot".into()), "1".into());
    s.kv.insert((NS_COUNTER.into(), "runs".into()), "1".into());
    s.outbox
        .retain(|r| r.ordering_key != format!("{ROUTE_COUNTER}/{lost}"));
    s.sink.retain(|a| a.event_id != "ev-11");
    s.kv.remove(&(NS_DOWNSTREAM.into(), "seen/ev-11".into()));
    // ...and the first one's applied twice.
    let twice = s.sent[1].id.clone();
    s.kv.insert((NS_COUNTER.into(), format!("seen/{twice}")), "2".into());
    let f = failing(&s);
    assert_eq!(f.lost, 1, "{f:#?}");
    assert_eq!(f.duplicate_effects, 1, "{f:#?}");
    assert!(f.examples["lost"][0].contains(&lost), "{f:#?}");
    assert!(
        f.examples["duplicate_effects"][0].contains(&twice),
        "{f:#?}"
    );
}

#[test]
fn a_queued_message_is_not_lost_and_an_unsent_effect_is_unexpected() {
    let f = failing_after(|s| {
        let flaky = undo_flaky(s);
        s.queued.insert(flaky);
        kv(s, NS_ENROLL, "matricula/999", "{}");
    });
    assert_eq!((f.lost, f.still_queued, f.unexpected), (0, 1, 1), "{f:#?}");
}

#[test]
fn counters_above_their_messages_are_duplicates() {
    let f = failing_after(|s| kv(s, NS_COUNTER, "counter/hot", "3"));
    assert_eq!(f.duplicate_effects, 1);
}

#[test]
fn duplicate_events_are_judged_by_the_fault_window() {
    let mut s = clean();
    s.sink[0].at_ms = 2_800;
    copy(&mut s, "ev-1", 4_400);
    assert_eq!(failing(&s).duplicate_events_beyond_window, 1);
    s.faults.push(fault(3_000, 3_500));
    let f = passing(&s);
    let duplicates = (
        f.duplicate_events_beyond_window,
        f.duplicate_events_within_window,
    );
    assert_eq!(duplicates, (0, 1));
    // A redelivery to the sink itself (its ack was lost) is not a second publish.
    s.faults.clear();
    s.sink.last_mut().expect("arrival").redelivered = true;
    passing(&s);
}

/// Adds `excuse` for another event, then for the duplicated ev-1 (first copy at 2.8 s, the
/// other at 9 s): the run fails until ev-1's own excuse, then passes with the copy counted
/// by `counted` and none beyond a window.
fn excused_only_for_its_event(
    s: &mut State,
    excuse: fn(&mut RelayLogs, &str),
    counted: fn(&Findings) -> usize,
) {
    s.sink[0].at_ms = 2_800;
    copy(s, "ev-1", 9_000);
    excuse(&mut s.relay_logs, "ev-2");
    assert_eq!(failing(s).duplicate_events_beyond_window, 1);
    excuse(&mut s.relay_logs, "ev-1");
    let f = passing(s);
    assert_eq!((f.duplicate_events_beyond_window, counted(&f)), (0, 1));
}

/// A relay that got no confirm within its timeout sends the event again, with no fault: the
/// documented at-least-once resend. Only that event's copies are excused.
#[test]
fn a_duplicate_after_a_relays_confirm_timeout_is_reported_not_failed() {
    excused_only_for_its_event(
        &mut clean(),
        |logs, id| {
            logs.confirm_timeouts.insert(id.into());
        },
        |f| f.duplicate_events_after_confirm_timeout,
    );
}

/// A gateway killed after its relay's publish and before the mark: the restarted relay
/// sends the row again, but its publishes fail (an unroutable fault) and back off past the
/// kill's window. Excused only for that event, and only when its first copy lies in a
/// fault's window.
#[test]
fn a_resend_delayed_by_failed_publishes_past_its_faults_window_is_reported_not_failed() {
    let mut s = clean();
    s.faults.push(fault(2_500, 3_000));
    excused_only_for_its_event(
        &mut s,
        |logs, id| {
            logs.failed_publishes.insert(id.into());
        },
        |f| f.duplicate_events_after_failed_publishes,
    );
    // A first copy outside every window: no fault to resend it, so still a finding.
    s.sink[0].at_ms = 6_000;
    assert_eq!(failing(&s).duplicate_events_beyond_window, 1);
}

/// A relay's mark held up by the store (it did not answer) well past the lead window, then a
/// relay killed: the next relay sends the row again. Allowed only when the row's mark
/// committed after the fault began and a relay logged the mark it could not write between
/// the first copy and the fault.
#[test]
fn a_resend_of_a_row_whose_mark_the_store_held_up_is_reported_not_failed() {
    let mut s = clean();
    s.started_unix_ms = 1_000_000;
    s.sink[0].at_ms = 2_800;
    s.faults.push(fault(9_000, 9_100));
    copy(&mut s, "ev-1", 9_400);
    let marked_at = |s: &mut State, ms: i64| {
        let row = s.outbox.iter_mut().find(|r| r.event_id == "ev-1");
        row.expect("ev-1").published_at = Some(1_000_000 + ms);
    };
    let trouble = |s: &mut State, ms: i64| {
        s.relay_logs.mark_troubles.push(MarkTrouble {
            at_unix_ms: 1_000_000 + ms,
            line: "could not mark confirmed outbox rows published".into(),
        });
    };
    marked_at(&mut s, 9_500);
    assert_eq!(
        failing(&s).duplicate_events_beyond_window,
        1,
        "no trouble logged"
    );
    trouble(&mut s, 9_600);
    trouble(&mut s, 2_000);
    assert_eq!(
        failing(&s).duplicate_events_beyond_window,
        1,
        "logged after the resend and before the first copy"
    );
    // A relay killed while its mark hangs never logs it: others' failed marks before the
    // resend are the evidence.
    trouble(&mut s, 9_050);
    let f = passing(&s);
    assert_eq!(
        (
            f.duplicate_events_beyond_window,
            f.duplicate_events_after_delayed_mark
        ),
        (0, 1)
    );
    // Marked before the fault hit: sending it again is a relay's defect.
    marked_at(&mut s, 8_000);
    assert_eq!(
        failing(&s).duplicate_events_beyond_window,
        1,
        "marked before the fault"
    );
    // Never marked, or the copy past the fault's window: still a finding.
    s.outbox.iter_mut().for_each(|r| r.published_at = None);
    assert_eq!(
        failing(&s).duplicate_events_beyond_window,
        1,
        "never marked"
    );
    marked_at(&mut s, 9_500);
    s.sink.last_mut().expect("copy").at_ms = 20_000;
    assert_eq!(
        failing(&s).duplicate_events_beyond_window,
        1,
        "past the window"
    );
}

#[test]
fn out_of_order_events_and_reasonless_dead_letters_fail() {
    let f = failing_after(|s| {
        s.sink.swap(0, 1);
        s.dead_letters[0].reason = " ".into();
    });
    assert_eq!((f.order_violations, f.dead_letters_without_reason), (1, 1));
}

/// A node failure: the broker took ev-1 back from a sink consumer that never recorded it and
/// redelivered it after ev-2. Its publish order cannot be seen, so it is no violation; the same
/// order with a fresh ev-1 is one.
#[test]
fn an_event_first_seen_as_a_redelivery_is_left_out_of_the_order_check() {
    let mut s = clean();
    s.sink.swap(0, 1);
    assert_eq!(failing(&s).order_violations, 1);
    let ev1 = s
        .sink
        .iter_mut()
        .find(|a| a.event_id == "ev-1")
        .expect("ev-1 arrived");
    ev1.redelivered = true;
    let f = passing(&s);
    assert_eq!((f.order_violations, f.order_unobservable), (0, 1));
}

#[test]
fn a_poison_message_published_twice_may_be_dead_lettered_twice() {
    let mut s = clean();
    let poison = s.sent[4].id.clone();
    s.dead_letters.push(s.dead_letters[0].clone());
    assert_eq!(check(&s).repeated_dead_letters, 1);
    s.publishes.insert(poison, 2);
    assert_eq!(passing(&s).repeated_dead_letters, 0);
}

#[test]
fn a_good_message_dead_lettered_is_unexpected() {
    let f = failing_after(|s| {
        let flaky = undo_flaky(s);
        s.dead_letters.push(DeadLetter {
            route: ROUTE_FLAKY.into(),
            message_id: Some(flaky),
            reason: "store unavailable".into(),
            ..DeadLetter::default()
        });
    });
    assert_eq!((f.unexpected, f.lost), (1, 0), "{f:#?}");
}

fn fault(start_ms: u64, end_ms: u64) -> FaultSpan {
    FaultSpan {
        start_ms,
        end_ms,
        recovered: true,
    }
}

fn copy(s: &mut State, event_id: &str, at_ms: u64) {
    s.sink.push(Arrival {
        event_id: event_id.into(),
        at_ms,
        redelivered: false,
    });
}

/// Faults every 2 s, whose windows (1 s after, 0.5 s before) overlap into one stretch:
/// the old "any fault between the first and the last copy" rule passed every duplicate
/// in it. Each copy now needs one fault whose window holds it and the first copy.
#[test]
fn a_duplicate_spread_over_several_faults_windows_fails_even_when_they_overlap() {
    let mut s = clean();
    s.faults = (0..20)
        .map(|i| fault(10_000 + i * 2_000, 10_500 + i * 2_000))
        .collect();
    s.sink[0].at_ms = 10_200;
    copy(&mut s, "ev-1", 40_100);
    let f = failing(&s);
    assert_eq!(f.duplicate_events_beyond_window, 1, "{f:#?}");
    assert!(f.examples["duplicate_events_beyond_window"][0].contains("ev-1"));
    // The same copy soon after the first, in one fault's window, is at least once.
    s.sink.last_mut().expect("copy").at_ms = 11_400;
    let f = passing(&s);
    let duplicates = (
        f.duplicate_events_beyond_window,
        f.duplicate_events_within_window,
    );
    assert_eq!(duplicates, (0, 1), "{f:#?}");
}

#[test]
fn a_duplicate_outside_every_window_fails_and_that_time_is_measured() {
    let mut s = clean();
    s.faults = vec![fault(1_000, 2_000), fault(20_000, 21_000)];
    s.sink[0].at_ms = 8_000;
    copy(&mut s, "ev-1", 9_000);
    assert_eq!(failing(&s).duplicate_events_beyond_window, 1);
    // 0..30 s, minus the windows 0.5..3 s and 19.5..22 s.
    s.sink.last_mut().expect("copy").at_ms = 30_000;
    assert_eq!(check(&s).ms_outside_windows, 30_000 - 2_500 - 2_500);
}

#[test]
fn an_input_left_in_a_queue_fails_the_run() {
    let f = failing_after(|s| {
        let flaky = undo_flaky(s);
        s.queued.insert(flaky);
    });
    let counts = (f.lost, f.still_queued, f.left_in_queues);
    assert_eq!(counts, (0, 1, 1), "{f:#?}");
}

/// A redelivery of a finished message, still in its queue: the drain did not finish.
#[test]
fn any_message_left_in_a_queue_fails_the_run_even_with_its_effect_done() {
    let f = failing_after(|s| {
        s.queued.insert(s.sent[0].id.clone());
    });
    assert_eq!((f.still_queued, f.left_in_queues), (0, 1), "{f:#?}");
}

#[test]
fn an_event_with_no_downstream_effect_left_in_a_queue_fails_the_run() {
    let f = failing_after(|s| {
        s.kv.remove(&(NS_DOWNSTREAM.into(), "seen/ev-2".into()));
        s.queued.insert("ev-2".into());
    });
    assert_eq!((f.lost, f.still_queued), (0, 1), "{f:#?}");
}

#[test]
fn a_run_that_did_not_drain_fails() {
    failing_after(|s| s.drained = false);
}

#[test]
fn a_process_that_exited_on_its_own_fails_the_run() {
    let f = failing_after(|s| {
        s.exits
            .push("gateway-1 exited (exit status: 1) at 12.0 s".into())
    });
    assert_eq!(f.unexpected_exits, 1);
}

#[test]
fn a_fault_with_no_recovery_fails_the_run() {
    let f = failing_after(|s| {
        s.faults.push(FaultSpan {
            recovered: false,
            ..fault(1_000, 2_000)
        })
    });
    assert_eq!(f.stalled_faults, 1);
}

/// The publisher gave up on a message whose publishes all timed out: the broker may never
/// have had it, so no effect is not a loss. Once confirmed, it is.
#[test]
fn an_input_never_confirmed_with_no_effect_is_not_lost_but_a_confirmed_one_is() {
    let mut s = clean();
    let flaky = undo_flaky(&mut s);
    s.unconfirmed.insert(flaky);
    let f = passing(&s);
    assert_eq!((f.lost, f.unconfirmed_without_effect), (0, 1), "{f:#?}");
    s.unconfirmed.clear();
    assert_eq!(failing(&s).lost, 1);
}

/// A poison input's dead letter parked in `Q.dlq.parked` is not lost, and is counted; a
/// good input parked was dead-lettered, which is unexpected.
#[test]
fn parked_dead_letters_are_counted_not_lost_and_a_good_one_parked_fails() {
    let mut s = clean();
    let poison = s.sent[4].id.clone();
    s.dead_letters.clear();
    s.parked.insert(poison);
    let f = passing(&s);
    assert_eq!((f.lost, f.parked_dead_letters), (0, 1), "{f:#?}");
    let flaky = undo_flaky(&mut s);
    s.parked.insert(flaky);
    let f = failing(&s);
    assert_eq!((f.unexpected, f.lost), (1, 0), "{f:#?}");
}

#[test]
fn an_event_marked_published_that_never_reached_the_sink_is_lost() {
    let f = failing_after(|s| s.sink.retain(|a| a.event_id != "ev-3"));
    assert_eq!(f.lost, 1);
}

#[test]
fn an_event_applied_twice_downstream_or_missing_there_fails() {
    let f = failing_after(|s| {
        kv(s, NS_DOWNSTREAM, "seen/ev-2", "2");
        kv(s, NS_DOWNSTREAM, "seen/ev-3", "0");
    });
    assert_eq!((f.duplicate_effects, f.lost), (1, 1), "{f:#?}");
}

#[test]
fn an_enrollment_with_too_few_or_too_many_outbox_rows_fails() {
    let too_few = failing_after(|s| {
        s.outbox.retain(|r| r.id != 3);
        s.sink.retain(|a| a.event_id != "ev-3");
    });
    assert_eq!(too_few.lost, 1);
    let too_many = failing_after(|s| {
        let enroll = s.sent[0].id.clone();
        event(s, 4, ROUTE_ENROLL, &enroll, 30);
    });
    assert_eq!(too_many.duplicate_effects, 1);
}

#[test]
fn a_transient_input_acked_too_early_or_a_poison_input_that_took_effect_is_unexpected() {
    let acked_early = failing_after(|s| {
        let flaky = s.sent[3].id.clone();
        kv(s, NS_FLAKY, &format!("done/{flaky}"), "2");
    });
    assert_eq!(acked_early.unexpected, 1);
    let poison_took_effect = failing_after(|s| kv(s, NS_ENROLL, "matricula/5", "{}"));
    assert_eq!(poison_took_effect.unexpected, 1);
}

#[test]
fn events_and_inbox_records_for_nothing_sent_are_unexpected() {
    let f = failing_after(|s| {
        s.inbox.insert((ROUTE_COUNTER.into(), "m-999".into()));
        copy(s, "ev-999", 50);
    });
    assert_eq!(f.unexpected, 2);
}

/// A row the poison-row fault committed, as the relay leaves it: parked once with its error.
fn poison_row(s: &mut State) -> &mut OutboxRow {
    s.outbox.push(OutboxRow {
        id: 900,
        event_id: "01a24400-0000-7000-8000-000000000900".into(),
        route: crate::config::ROUTE_POISON.into(),
        ordering_key: String::new(),
        published: false,
        attempts: 1,
        last_error: Some("permanent: cannot be published: routing key: too long".into()),
        created_at: 0,
        published_at: None,
    });
    s.outbox.last_mut().expect("just pushed")
}

#[test]
fn a_parked_poison_row_passes_and_is_not_an_event() {
    let mut s = clean();
    poison_row(&mut s);
    let f = passing(&s);
    assert_eq!((f.poison_rows, f.poison_rows_not_parked), (1, 0));
}

#[test]
fn a_poison_row_published_retried_or_without_its_error_fails() {
    let published = failing_after(|s| poison_row(s).published = true);
    let retried = failing_after(|s| poison_row(s).attempts = 4);
    let no_error = failing_after(|s| poison_row(s).last_error = None);
    for f in [published, retried, no_error] {
        assert_eq!(f.poison_rows_not_parked, 1);
    }
}

/// [`clean`] plus a batch input with its effect, event and inbox record.
fn with_batch() -> State {
    let mut s = clean();
    let b = sent(6, Kind::Batch { retry: true });
    kv(&mut s, NS_BATCH, &format!("done/{}", b.id), "1");
    kv(&mut s, NS_BATCH, &format!("batch-len/{}", b.id), "16");
    event(&mut s, 20, ROUTE_BATCH, &b.id, 30);
    s.inbox.insert((ROUTE_BATCH.into(), b.id.clone()));
    s.sent.push(b);
    s
}

#[test]
fn a_batch_input_applied_twice_or_never_fails() {
    passing(&with_batch());
    let mut twice = with_batch();
    kv(&mut twice, NS_BATCH, "done/m-6", "2");
    assert_eq!(failing(&twice).duplicate_effects, 1);
    let mut never = with_batch();
    never.kv.remove(&(NS_BATCH.into(), "done/m-6".into()));
    never.outbox.retain(|r| r.route != ROUTE_BATCH);
    never.sink.retain(|a| a.event_id != "ev-20");
    never
        .kv
        .remove(&(NS_DOWNSTREAM.into(), "seen/ev-20".into()));
    assert_eq!(failing(&never).lost, 1);
}

/// [`clean`] plus three rows of one large transaction, delivered in order.
fn with_large_transaction() -> State {
    let mut s = clean();
    for i in 0..3 {
        event(&mut s, 30 + i, ROUTE_LARGE, "tx-1", 40 + i as u64);
    }
    s
}

#[test]
fn a_large_transactions_rows_are_checked_as_every_event() {
    assert_eq!(passing(&with_large_transaction()).large_rows, 3);
    // One row never took effect downstream.
    let mut lost = with_large_transaction();
    lost.kv.remove(&(NS_DOWNSTREAM.into(), "seen/ev-31".into()));
    assert_eq!(failing(&lost).lost, 1);
    // Its rows reached the sink out of order.
    let mut reordered = with_large_transaction();
    let n = reordered.sink.len();
    reordered.sink.swap(n - 1, n - 2);
    assert_eq!(failing(&reordered).order_violations, 1);
}

/// [`clean`] plus a trapped message (m-7), its dead letter (id 70) edited and its copy
/// applied, and another dead letter of it (id 71) replayed, whose copy came back (id 72).
fn with_repairs() -> State {
    let mut s = clean();
    let trap = sent(7, Kind::PoisonTrap);
    let letter = |id, replay_of, replayed, edited| DeadLetter {
        id,
        route: ROUTE_FLAKY.into(),
        message_id: Some(trap.id.clone()),
        reason: "trap: unreachable".into(),
        replay_of,
        replay_count: i64::from(replayed),
        replayed,
        edited,
    };
    s.dead_letters.push(letter(70, None, true, true));
    s.dead_letters.push(letter(71, None, true, false));
    s.dead_letters.push(letter(72, Some(71), false, false));
    s.publishes.insert(trap.id.clone(), 2);
    kv(&mut s, NS_FLAKY, &format!("done/{}", trap.id), "2");
    s.inbox.insert((ROUTE_FLAKY.into(), trap.id.clone()));
    s.repairs.edits_sent.insert(trap.id.clone());
    s.sent.push(trap);
    s
}

#[test]
fn an_edited_copy_may_take_effect_and_a_replayed_one_must_come_back() {
    let f = passing(&with_repairs());
    assert_eq!((f.edits_sent, f.dead_letters_replayed), (1, 1));
    // A trapped message that took effect though nobody edited it.
    let mut unedited = with_repairs();
    unedited.dead_letters[1].edited = false;
    unedited.repairs.edits_sent.clear();
    assert_eq!(failing(&unedited).unexpected, 1);
    // The edit reported sent, its copy never took effect.
    let mut vanished = with_repairs();
    vanished.kv.remove(&(NS_FLAKY.into(), "done/m-7".into()));
    vanished.inbox.remove(&(ROUTE_FLAKY.into(), "m-7".into()));
    assert!(failing(&vanished).lost >= 1);
    // The replayed copy neither came back nor was deduplicated.
    let mut lost_replay = with_repairs();
    lost_replay
        .dead_letters
        .retain(|d| d.id != 72 && d.id != 70);
    lost_replay
        .inbox
        .remove(&(ROUTE_FLAKY.into(), "m-7".into()));
    lost_replay.kv.remove(&(NS_FLAKY.into(), "done/m-7".into()));
    lost_replay.repairs.edits_sent.clear();
    assert_eq!(failing(&lost_replay).lost, 1);
}

#[test]
fn two_edits_sent_or_a_dead_letter_replayed_twice_fail() {
    let mut both = with_repairs();
    both.repairs.edits_both_sent.push("m-7".into());
    assert_eq!(failing(&both).edits_both_sent, 1);
    let mut twice = with_repairs();
    twice.dead_letters[2].replay_count = 2;
    assert_eq!(failing(&twice).dead_letters_replayed_twice, 1);
}
