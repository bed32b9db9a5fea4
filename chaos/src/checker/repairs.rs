//! The DLQ repair fault's copies: each edit that reported sent took effect, no dead letter was
//! replayed twice, and every replayed copy came back (a trapped message dead-letters again).

use std::collections::HashSet;

use super::{Findings, State};
use crate::config::NS_FLAKY;

/// Some dead letter of message `id` was edited: its copy may take effect.
pub(super) fn edited(state: &State, id: &str) -> bool {
    state
        .dead_letters
        .iter()
        .any(|d| d.edited && d.message_id.as_deref() == Some(id))
}

pub(super) fn check_repairs(state: &State, f: &mut Findings) {
    f.edits_sent = state.repairs.edits_sent.len();
    for id in &state.repairs.edits_both_sent {
        f.edits_both_sent += 1;
        f.note(
            "edits_both_sent",
            format!("{id}: two concurrent edits of one dead letter both sent a copy"),
        );
    }
    for id in &state.repairs.edits_sent {
        let applied = state
            .kv
            .contains_key(&(NS_FLAKY.to_owned(), format!("done/{id}")));
        if !applied {
            lost_or_queued(state, id, "its edited copy never took effect", f);
        }
    }
    let came_back: HashSet<i64> = state
        .dead_letters
        .iter()
        .filter_map(|d| d.replay_of)
        .collect();
    for d in &state.dead_letters {
        if d.replay_count > 1 {
            f.dead_letters_replayed_twice += 1;
            f.note(
                "dead_letters_replayed_twice",
                format!(
                    "dead letter {} replayed or edited {} times",
                    d.id, d.replay_count
                ),
            );
        }
        if !d.replayed || d.edited {
            continue;
        }
        f.dead_letters_replayed += 1;
        let Some(id) = d.message_id.as_deref() else {
            continue;
        };
        // An earlier copy of the same message that took effect (an edited one) makes the
        // route's inbox ack this copy as a duplicate: not lost.
        let deduplicated = state.inbox.contains(&(d.route.clone(), id.to_owned()));
        if !came_back.contains(&d.id) && !deduplicated {
            lost_or_queued(
                state,
                id,
                "a replayed copy neither came back nor took effect",
                f,
            );
        }
    }
}

fn lost_or_queued(state: &State, id: &str, what: &str, f: &mut Findings) {
    if state.queued.contains(id) {
        f.still_queued += 1;
        f.note("still_queued", format!("{id}: {what}, still queued"));
    } else {
        f.lost += 1;
        f.note("lost", format!("{id}: {what}"));
    }
}
